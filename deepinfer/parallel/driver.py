"""Rank 0's end of the protocol: it tells the other ranks each step's inputs and each logits call,
and turns a failed collective into an error that names the rank that failed and why."""
from __future__ import annotations

import atexit
import threading
import time

import torch
import torch.distributed as dist

from deepinfer.parallel.errors import WorkerError
from deepinfer.parallel.launch import Ranks
from deepinfer.parallel.protocol import HEADER, LOGITS, STEP, STOP, Sliding, StepSeqs, pack_step, send_payload

__all__ = ["Driver", "WorkerError"]


class Driver:
    """Sends the model runner's work to ranks 1..N-1 (``ModelRunner.ranks``)."""

    def __init__(self, ranks: Ranks, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device
        self.stopped: str | None = None  # why the ranks were stopped (None: they run)
        atexit.register(self.shutdown)  # (a program that never shuts its engine down still stops its ranks)
        if ranks.processes:
            threading.Thread(target=self._watch, name="deepinfer-tp-watch", daemon=True).start()

    def _watch(self) -> None:
        """Notice a spawned rank's death even while rank 0 waits in a collective that will never end."""
        while self.stopped is None:
            for rank, p in enumerate(self.ranks.processes, start=1):
                if not p.is_alive():
                    self.on_rank_death(rank)
                    return
            time.sleep(0.5)

    def on_rank_death(self, rank: int) -> None:
        """Gloo fails a collective with a dead peer at once; NCCL and HCCL may wait until their timeout:
        abort the group, so that rank 0's pending collective fails now and names the rank (untested
        here: no GPUs)."""
        if dist.is_initialized() and dist.get_backend() != "gloo":
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()

    def _header(self, command: int, a: int = 0, b: int = 0) -> None:
        if self.stopped is not None:
            raise WorkerError(f"this engine's {self.ranks.label} ranks were stopped ({self.stopped}); build a new engine")
        dist.broadcast(torch.tensor([command, a, b, 0][:HEADER], dtype=torch.long, device=self.device), src=0,
                       group=self.ranks.tp.group)

    def send_step(self, seqs: StepSeqs, sliding: Sliding, prev: torch.Tensor | None) -> None:
        """Before rank 0's forward: the step's sequences, and the samples its placeholders stand for."""
        payload = pack_step(seqs, sliding)
        self._header(STEP, len(payload), 0 if prev is None else prev.numel())
        send_payload(payload, prev, self.device, self.ranks.tp.group)

    def send_logits(self, hidden: torch.Tensor) -> None:
        """Before rank 0's ``compute_logits(hidden)``: the rows, so that every rank computes its part."""
        self._header(LOGITS, hidden.shape[0])
        dist.broadcast(hidden.contiguous(), src=0, group=self.ranks.tp.group)

    def failure(self, exc: BaseException) -> WorkerError:
        """The error to raise for ``exc``, raised by rank 0 during a step; the ranks are stopped (a
        step half-sent leaves them out of step with rank 0)."""
        if isinstance(exc, WorkerError):
            return exc
        why = self.ranks.worker_failure()
        if why is None and not self.ranks.processes:  # (a launcher's ranks: their own logs say which failed)
            why = ("a collective with the other ranks failed (a rank the launcher started may have died: see its "
                   f"log): {type(exc).__name__}: {exc}")
        why = why or f"rank 0 failed during a step: {type(exc).__name__}: {exc}"
        self.shutdown(why)
        return WorkerError(why)

    def shutdown(self, why: str = "the engine was shut down") -> None:
        """Tell the workers to stop (if they still can hear it), then end them and the process group."""
        if self.stopped is not None:
            return
        try:
            self._header(STOP)
        except Exception:  # noqa: BLE001, S110 (a worker already gone: ended below either way)
            pass
        self.stopped = why
        self.ranks.stop()
        atexit.unregister(self.shutdown)
