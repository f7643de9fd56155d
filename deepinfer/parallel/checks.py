"""Refuse a tensor-parallel configuration that cannot run, before any process starts, saying what is valid."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from deepinfer.core.model_config import ModelConfig
from deepinfer.parallel.launch import launched_world


class ParallelConfigError(ValueError):
    """A tensor-parallel size or combination this model, device or launcher cannot run."""


def check_tensor_parallel(size: int, mcfg: ModelConfig, model_cls: type, device_cls: type,
                          drafter: str | None, policy_classes: list[Any]) -> None:
    """Raise ParallelConfigError unless ``size`` ranks can run this model here with these plugins."""
    name = f"tensor_parallel_size {size}"
    if not getattr(model_cls, "supports_tensor_parallel", False):
        raise ParallelConfigError(f"{name}: the {mcfg.architecture} model definition does not shard over "
                                  "tensor-parallel ranks yet (the Llama family and DeepSeek-V2/V3 do); use "
                                  "tensor_parallel_size 1")
    valid = ", ".join(map(str, model_cls.tensor_parallel_sizes(mcfg)))
    if size > mcfg.num_attention_heads:
        raise ParallelConfigError(f"{name}: more ranks than the model's {mcfg.num_attention_heads} attention heads "
                                  f"(each rank holds whole heads); valid sizes: {valid}")
    if size not in model_cls.tensor_parallel_sizes(mcfg):
        raise ParallelConfigError(f"{name} does not split {mcfg.architecture} evenly ({model_cls.shard_facts(mcfg)}); "
                                  f"valid sizes: {valid}")
    backend = device_cls.dist_backend
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise ParallelConfigError(f"{name}: device plugin {device_cls.name!r} communicates through the "
                                  f"{backend!r} backend, which this torch build lacks; use tensor_parallel_size 1 "
                                  "or a torch build with it")
    launched = launched_world()
    if launched is not None and launched[1] != size:
        raise ParallelConfigError(f"{name}, but the launcher started {launched[1]} ranks (WORLD_SIZE); start "
                                  f"{size} ranks, or set tensor_parallel_size to {launched[1]}")
    if launched is None and backend != "gloo":
        count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
        if count < size:
            raise ParallelConfigError(f"{name} needs {size} devices on this host, which has {count}; use at most "
                                      f"{count}, or start ranks on several hosts with a launcher (torchrun)")
    if drafter is not None:
        raise ParallelConfigError(f"{name}: drafter {drafter!r} does not run with tensor parallelism yet (its "
                                  "draft model is not sharded); leave it out or use tensor_parallel_size 1")
    for cls in policy_classes:
        if hasattr(cls, "windowed_pool_blocks"):
            raise ParallelConfigError(f"{name}: cache policy {cls.name!r} keeps the sliding-window layers' KV in "
                                      "a pool of its own, which does not run with tensor parallelism yet; leave "
                                      "it out or use tensor_parallel_size 1")
