"""Start the ranks of a tensor-parallel engine: spawned on this host, or joined through torch.distributed's
env:// rendezvous when a launcher (torchrun, Slurm, ...) started every rank and set WORLD_SIZE, RANK,
MASTER_ADDR and MASTER_PORT."""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from deepinfer.core.config import EngineConfig
from deepinfer.parallel.state import TensorParallel

#: seconds rank 0 waits for a spawned rank to reach the store (importing torch and deepinfer)
JOIN_TIMEOUT = 300.0


def launched_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) set by a launcher (env://), or None: no launcher set them."""
    if "WORLD_SIZE" not in os.environ:
        return None
    rank = int(os.environ.get("RANK", "0"))
    return rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank))


def dist_backend(config: EngineConfig) -> str:
    """The device plugin's distributed backend (gloo on the CPU, nccl on CUDA, hccl on Ascend)."""
    from deepinfer.plugins.selection import select

    sel = select(config)
    return sel.classes[sel.one("device").name].dist_backend


def init_group(config: EngineConfig, rank: int, world: int, store: Any = None, local_rank: int | None = None
               ) -> TensorParallel:
    """Join the process group with the device's backend (through ``store``, or env:// without one)."""
    backend = dist_backend(config)
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    return TensorParallel(rank, world, dist.group.WORLD, rank if local_rank is None else local_rank)


@dataclass(slots=True)
class Ranks:
    """The ranks of one engine as rank 0 sees them: the group and, when it spawned them, the processes."""

    tp: TensorParallel
    processes: list[Any] = field(default_factory=list)  # rank r at processes[r - 1] (empty: a launcher's)
    errors: Any = None  # (rank, error, traceback) from spawned ranks that failed
    store: Any = None
    label: str = "tensor-parallel"  # (or "data-parallel": how errors name a rank)

    def worker_failure(self, wait: float = 2.0) -> str | None:
        """Which spawned rank died or raised, and why (given ``wait`` seconds to be seen); None: none did."""
        if self.errors is None:  # (a launcher's ranks, or ranks already stopped)
            return None
        deadline = time.monotonic() + wait
        while (time.monotonic() < deadline and self.errors.empty()
               and all(p.is_alive() for p in self.processes)):
            time.sleep(0.05)
        if not self.errors.empty():
            rank, error, tb = self.errors.get()
            return f"{self.label} rank {rank} failed: {error}\n{tb}"
        for rank, p in enumerate(self.processes, start=1):
            if not p.is_alive():
                p.join(1)
                return f"{self.label} rank {rank} (pid {p.pid}) died: {_exit_text(p.exitcode)}"
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the spawned ranks to end (they were told to stop, or have failed), end any that do
        not, and leave the process group."""
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
        if dist.is_initialized():
            with contextlib.suppress(RuntimeError, ValueError):  # (a group aborted after a rank's death)
                dist.destroy_process_group()
        if self.errors is not None:
            self.errors.close()
            self.errors = None
        atexit.unregister(self.stop)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code}"


def spawn_ranks(config: EngineConfig, world: int) -> Ranks:
    """Spawn ranks 1..world-1 on this host (torch.multiprocessing, spawn) and join them as rank 0."""
    import torch.multiprocessing as mp

    if dist.is_initialized():
        raise RuntimeError("this process is already in a torch.distributed group (another tensor-parallel "
                           "engine?); shut that engine down first: one tensor-parallel engine a process")

    from deepinfer.parallel.worker import worker_main

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker_main, name=f"deepinfer-tp-rank{r}", daemon=True,
                         args=(r, world, "127.0.0.1", store.port, config, errors, os.getpid()))
             for r in range(1, world)]
    for p in procs:
        p.start()
    ranks = Ranks(TensorParallel(0, world), procs, errors, store,
                  "tensor-parallel" if config.data_parallel_size == 1 else "data-parallel")
    atexit.register(ranks.stop, 0.0)
    deadline = time.monotonic() + JOIN_TIMEOUT
    try:
        for r, p in enumerate(procs, start=1):  # (a rank that dies while starting is named, not waited for)
            while not store.check([f"joined/{r}"]):
                if not p.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"rank {r} did not join within {JOIN_TIMEOUT:.0f} s")
                time.sleep(0.05)
        ranks.tp = init_group(config, 0, world, store=store)
    except Exception as e:  # noqa: BLE001 (any failure to start: named, and the ranks stopped)
        why = ranks.worker_failure(wait=1.0) or f"{type(e).__name__}: {e}"
        ranks.stop(0.0)
        raise RuntimeError(f"could not start the {ranks.label} ranks: {why}") from None
    return ranks


def join_launched(config: EngineConfig, rank: int, world: int, local_rank: int) -> Ranks:
    """Join the ranks a launcher started (env://). Rank 0 returns its ``Ranks``; any other rank serves
    rank 0 until it stops, then ends the process (exit status 0)."""
    tp = init_group(config, rank, world, local_rank=local_rank)
    if rank == 0:
        return Ranks(tp, label="tensor-parallel" if config.data_parallel_size == 1 else "data-parallel")
    from deepinfer.parallel.worker import run_worker

    try:
        run_worker(config, tp)
    finally:
        dist.destroy_process_group()
    raise SystemExit(0)


def start_ranks(config: EngineConfig, sel: Any, mcfg: Any, model_cls: type) -> Ranks:
    """Check the parallel combination (``checks``), then start the other ranks (spawned) or join a
    launcher's; returns rank 0's ``Ranks`` (other ranks of a launcher's never return)."""
    from deepinfer.parallel.checks import check_parallel

    drafter = sel.one("drafter")
    check_parallel(config, mcfg, model_cls, sel.classes[sel.one("device").name], drafter.name if drafter else None,
                   [sel.classes[i.name] for i in sel.all("cache_policy")])
    if (launched := launched_world()) is not None:
        return join_launched(config, *launched)
    return spawn_ranks(config, config.world_size)
