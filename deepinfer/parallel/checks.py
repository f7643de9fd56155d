"""Refuse a parallel configuration (tensor, data or expert parallelism) that cannot run, before any
process starts, saying what is valid."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from deepinfer.core.config import EngineConfig
from deepinfer.core.model_config import ModelConfig
from deepinfer.parallel.launch import launched_world


class ParallelConfigError(ValueError):
    """A tensor-, data- or expert-parallel size or combination this model, device or launcher cannot run."""


def check_parallel(config: EngineConfig, mcfg: ModelConfig, model_cls: type, device_cls: type,
                   drafter: str | None, policy_classes: list[Any]) -> None:
    """Raise ParallelConfigError unless ``config``'s ranks can run this model here with these plugins."""
    if config.data_parallel_size > 1 or config.enable_expert_parallel or config.num_redundant_experts:
        check_expert_parallel(config, mcfg, model_cls, policy_classes)
        name = (f"data_parallel_size {config.data_parallel_size}"
                + (" with enable_expert_parallel" if config.enable_expert_parallel else ""))
        check_world(name, config.world_size, "data parallelism", device_cls, drafter, policy_classes)
    else:
        check_tensor_parallel(config.tensor_parallel_size, mcfg, model_cls, device_cls, drafter, policy_classes)


def check_expert_parallel(config: EngineConfig, mcfg: ModelConfig, model_cls: type,
                          policy_classes: list[Any]) -> None:
    """Data parallelism with tensor parallelism, expert parallelism without a MoE model or with
    experts that do not divide over the ranks, redundant experts without expert parallelism."""
    tp, dp, world = config.tensor_parallel_size, config.data_parallel_size, config.world_size
    if tp > 1:
        raise ParallelConfigError(f"tensor_parallel_size {tp} with data_parallel_size {dp}"
                                  f"{' and enable_expert_parallel' if config.enable_expert_parallel else ''}: "
                                  "tensor and data parallelism do not combine yet; use tensor_parallel_size 1 with "
                                  f"data_parallel_size {world} (and enable_expert_parallel for a MoE model), or "
                                  f"tensor_parallel_size {world} alone")
    if config.num_redundant_experts and not config.enable_expert_parallel:
        raise ParallelConfigError(f"num_redundant_experts {config.num_redundant_experts} places expert replicas on "
                                  "expert-parallel ranks: set enable_expert_parallel (with data_parallel_size N), "
                                  "or leave num_redundant_experts at 0")
    for cls in policy_classes:
        if dp > 1 and cls.name != "no-cache":
            raise ParallelConfigError(f"data_parallel_size {dp}: cache policy {cls.name!r} would reuse blocks whose "
                                      "KV another rank wrote (each rank keeps its own requests' KV); leave it "
                                      "out, or use tensor_parallel_size instead")
    if not config.enable_expert_parallel:
        return
    num_experts = model_cls.num_routed_experts(mcfg) if getattr(model_cls, "supports_expert_parallel", False) else 0
    if num_experts == 0:
        raise ParallelConfigError(f"enable_expert_parallel: {mcfg.architecture} has no routed experts to shard "
                                  "(expert parallelism is for mixture-of-experts models: DeepSeek-V2/V3); leave "
                                  "it out (data_parallel_size alone runs whole replicas)")
    if (problem := model_cls.expert_parallel_problem(mcfg)) is not None:
        raise ParallelConfigError(f"enable_expert_parallel: {mcfg.architecture} with {problem} cannot shard its "
                                  "experts yet; leave enable_expert_parallel out")
    slots = num_experts + config.num_redundant_experts
    if slots % world:
        sizes = ", ".join(str(n) for n in range(2, slots + 1) if slots % n == 0)
        raise ParallelConfigError(f"enable_expert_parallel over {world} ranks: {num_experts} routed experts + "
                                  f"{config.num_redundant_experts} redundant = {slots} expert slots a layer do not "
                                  f"divide over {world} ranks (each holds as many); valid data_parallel_size for "
                                  f"{slots} slots: {sizes}, or set num_redundant_experts so that experts + "
                                  f"redundant is a multiple of {world}")


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
    check_world(name, size, "tensor parallelism", device_cls, drafter, policy_classes)
    for cls in policy_classes:
        if hasattr(cls, "windowed_pool_blocks"):
            raise ParallelConfigError(f"{name}: cache policy {cls.name!r} keeps the sliding-window layers' KV in "
                                      "a pool of its own, which does not run with tensor parallelism yet; leave "
                                      "it out or use tensor_parallel_size 1")


def check_world(name: str, size: int, what: str, device_cls: type, drafter: str | None,
                policy_classes: list[Any]) -> None:
    """What any ``size`` ranks need: the device's backend, the launcher's world size, enough devices,
    no drafter."""
    backend = device_cls.dist_backend
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise ParallelConfigError(f"{name}: device plugin {device_cls.name!r} communicates through the "
                                  f"{backend!r} backend, which this torch build lacks; use one rank "
                                  "or a torch build with it")
    launched = launched_world()
    if launched is not None and launched[1] != size:
        raise ParallelConfigError(f"{name}, but the launcher started {launched[1]} ranks (WORLD_SIZE); start "
                                  f"{size} ranks, or set the parallel sizes to make {launched[1]}")
    if launched is None and backend != "gloo":
        count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
        if count < size:
            raise ParallelConfigError(f"{name} needs {size} devices on this host, which has {count}; use at most "
                                      f"{count}, or start ranks on several hosts with a launcher (torchrun)")
    if drafter is not None:
        raise ParallelConfigError(f"{name}: drafter {drafter!r} does not run with {what} yet (its "
                                  "draft model is not sharded); leave it out or use one rank")
