"""NVIDIA device plugins: `sm90` (Hopper) and `sm100` (Blackwell, CUDA 13+), on one CUDA base."""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Device
from deepinfer.plugins.capabilities import DeviceGraphs, FusedOps


class CUDAOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_index: int = Field(0, ge=0)
    activation_reserve_gb: float = Field(2.0, ge=0, description="memory kept free for activations")
    fused_kernels: bool = Field(True, description="use deepinfer's Triton RMSNorm, rotary, SiLU-mul, embedding "
                                "and greedy argmax kernels")
    single_token_gemv: bool = Field(True, description="single-token steps (batch-1 decode) run each projection "
                                    "as one Triton GEMV with its norm, rotary, SiLU-mul or residual add "
                                    "folded in (needs fused_kernels)")
    gemv_rows: int = Field(16, ge=1, le=16, description="steps of 2 to this many tokens (a verification of "
                           "drafts, a small decode batch) run each projection as one multi-row Triton GEMV "
                           "with its neighbours folded in, as single-token steps do (needs single_token_gemv; "
                           "heads of a multiple of 32); 1: only single-token steps")
    programmatic_launch: bool = Field(True, description="launch the single-token GEMVs, the embedding and the "
                                      "argmax with programmatic dependent launch (compute capability 9.0+), "
                                      "each starting while the previous kernel finishes (a GEMV reads its "
                                      "first weights meanwhile), and let the staging kernel of a replay "
                                      "start the next kernel at once")
    l2_keep_mb: float = Field(16.0, ge=0, description="MB of the single-token GEMVs' weights kept in the L2 "
                              "cache from one decode step to the next (the weights first read, loaded "
                              "evict_last: a draft model's when there is one, since its graphs are "
                              "captured first, then the target's first layers; the rest streamed "
                              "evict_first); 0: the default cache policy")


class CUDAGraphs(DeviceGraphs):
    """CUDA graphs sharing one memory pool; each function is warmed up on a side stream first."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # compiles the kernels and settles the allocator
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = fn()
        torch.cuda.synchronize(self.device)
        return graph.replay, out


def _runtime_version() -> tuple[int, int] | None:
    v = torch.version.cuda
    if not v:
        return None
    major, minor = (int(x) for x in v.split(".")[:2])
    return major, minor


class CUDADevice(Device):
    """One NVIDIA GPU of a given architecture family; the subclasses name the family."""

    dist_backend = "nccl"
    default_attention = "triton"
    Options = CUDAOptions
    arch_major: ClassVar[int] = 0
    family: ClassVar[str] = ""
    min_cuda: ClassVar[tuple[int, int]] = (12, 0)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        rt = _runtime_version()
        if rt is None:
            return f"torch {torch.__version__} is built without CUDA"
        if not torch.cuda.is_available():
            return "no NVIDIA GPU is visible (torch.cuda.is_available() is False)"
        major, minor = torch.cuda.get_device_capability(0)
        if major != cls.arch_major:
            other = {9: "sm90", 10: "sm100"}.get(major)
            hint = f"; use the {other} plugin" if other else ""
            return (f"GPU 0 ({torch.cuda.get_device_name(0)}) has compute capability {major}.{minor}, "
                    f"not {cls.family} ({cls.arch_major}.x){hint}")
        if rt < cls.min_cuda:
            return (f"{cls.family} needs CUDA {cls.min_cuda[0]}.{cls.min_cuda[1]} or newer; "
                    f"torch is built with CUDA {rt[0]}.{rt[1]}")
        return None

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.options.device_index)

    def kv_cache_budget(self, model_bytes: int) -> int:
        cfg = self.ctx.config
        if cfg.kv_cache_memory_gb is not None:
            return int(cfg.kv_cache_memory_gb * (1 << 30))
        dev = self.torch_device
        free, total = torch.cuda.mem_get_info(dev)
        mine = torch.cuda.memory_allocated(dev)  # live tensors: the weights, already loaded
        cached = torch.cuda.memory_reserved(dev) - mine  # ours to reuse, though not "free"
        reserve = int(self.options.activation_reserve_gb * (1 << 30))
        # our share of the GPU, less what we hold; never more than is actually available (other
        # processes may hold memory too)
        budget = min(int(total * cfg.gpu_memory_utilization) - mine, free + cached) - reserve
        if budget <= 0:
            gib = 1 << 30
            raise ValueError(f"{self.name}: no GPU memory left for the KV cache: {free / gib:.1f} GiB free of "
                             f"{total / gib:.1f} GiB, this process holds {mine / gib:.1f} GiB, "
                             f"{reserve / gib:.1f} GiB kept for activations; free the GPU or set "
                             "kv_cache_memory_gb")
        return budget

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def fused_ops(self) -> FusedOps | None:
        if not self.options.fused_kernels:
            return None
        try:
            import deepinfer_kernels
        except ImportError:  # no triton: plain torch layers
            return None
        return deepinfer_kernels.FusedOps(single_token_gemv=self.options.single_token_gemv,
                                          pdl=self.options.programmatic_launch,
                                          l2_keep_bytes=int(self.options.l2_keep_mb * 1e6),
                                          gemv_rows=self.options.gemv_rows)

    def batch_invariance_unavailable(self) -> str | None:
        # (cuBLAS picks its kernels, and so its order of sums, by the number of rows; the single-token
        # GEMVs sum in another order than the batched projections)
        return ("cuBLAS and the single-token GEMVs sum a row in an order that depends on the batch's rows; "
                "a batch-invariant Triton matmul for CUDA devices is not written yet (the cpu device has "
                "its batch-invariant mode)")

    def graphs(self) -> CUDAGraphs:
        return CUDAGraphs(self.torch_device)


class SM90Device(CUDADevice):
    """NVIDIA Hopper (H100, H200): compute capability 9.x."""

    name = "sm90"
    specificity = 90
    arch_major = 9
    family = "Hopper"


class SM100Device(CUDADevice):
    """NVIDIA Blackwell (B200, GB200): compute capability 10.x, CUDA 13 or newer."""

    name = "sm100"
    specificity = 100
    arch_major = 10
    family = "Blackwell"
    min_cuda = (13, 0)
