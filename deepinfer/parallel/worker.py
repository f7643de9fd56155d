"""Ranks 1..N-1: build this rank's shard of the model and its KV cache, then run what rank 0 sends."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from deepinfer.core.config import EngineConfig
from deepinfer.core.eager_batch import build_step_batch
from deepinfer.parallel.data_parallel import serve_dp_step, serve_expert_command
from deepinfer.parallel.protocol import (
    DP_STEP,
    EXPERT_LOAD,
    EXPERT_RESET,
    HEADER,
    LOGITS,
    PLACE,
    STEP,
    STOP,
    receive_payload,
    unpack_step,
)
from deepinfer.parallel.state import TensorParallel


@torch.inference_mode()
def serve_driver(model: Any, attention: Any, kv_caches: list[Any], block_size: int, device: torch.device,
                 dtype: torch.dtype, tp: TensorParallel, blocks_per_rank: int = 0) -> None:
    """Run rank 0's steps and logits calls on this rank's shard (or, with data parallelism, its
    own sequences of each step, in its ``blocks_per_rank`` blocks of rank 0's pool, and the model's
    expert collectives) until rank 0 says stop."""
    header = torch.empty(HEADER, dtype=torch.long, device=device)
    hidden_size = model.config.hidden_size
    while True:
        dist.broadcast(header, src=0, group=tp.group)
        command, a, b, _ = header.tolist()
        if command == STOP:
            return
        if command == STEP:
            payload, prev = receive_payload(a, b, device, tp.group)
            seqs, sliding = unpack_step(payload)
            batch = build_step_batch(seqs, block_size, device, sliding, prev, ops=model.fused_ops)
            model(batch.input_ids, batch.positions, kv_caches, attention.build_metadata(batch))
        elif command == LOGITS:
            rows = torch.empty(a, hidden_size, dtype=dtype, device=device)
            dist.broadcast(rows, src=0, group=tp.group)
            model.compute_logits(rows)
        elif command == DP_STEP:
            serve_dp_step(model, attention, kv_caches, block_size, blocks_per_rank, device, dtype, tp, a, b)
        elif command in (EXPERT_LOAD, EXPERT_RESET, PLACE):
            serve_expert_command(model, command, device, tp)
        else:
            raise RuntimeError(f"rank {tp.rank}: unknown command {command} from rank 0 (a protocol mismatch)")


def run_worker(config: EngineConfig, tp: TensorParallel) -> None:
    """Build this rank's shard (the same plugins, model and KV pool size as rank 0) and serve rank 0.
    Rank 0 decides when the ranks stop: a terminal's Ctrl-C or a launcher's SIGTERM, sent to every
    rank, must not end this one while rank 0 drains its requests (it ends when told to stop, when
    rank 0's connection closes, or by SIGKILL)."""
    from deepinfer.builder import build_shard

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    shard = build_shard(config, tp, progress=False)
    serve_driver(shard.model, shard.attention, shard.kv_caches, config.block_size, shard.device.torch_device,
                 shard.dtype, tp, shard.kv.pool.num_blocks)


def _watch_parent(parent_pid: int) -> None:
    """End this process when the one that spawned it is gone (nothing left running after a crash)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="deepinfer-parent-watch", daemon=True).start()


def worker_main(rank: int, world: int, host: str, port: int, config: EngineConfig, errors: Any,
                parent_pid: int) -> None:
    """Entry point of a spawned rank: join rank 0's store, build, serve; report a failure on ``errors``."""
    _watch_parent(parent_pid)
    from deepinfer.parallel.launch import init_group

    try:
        store = dist.TCPStore(host, port, world, is_master=False)
        store.set(f"joined/{rank}", "1")
        tp = init_group(config, rank, world, store=store)
        run_worker(config, tp)
    except BaseException as e:  # noqa: BLE001 (every failure goes to rank 0, which names it)
        errors.put((rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
