"""The `cpu` device: always present; the KV pool takes a share of free memory. On an AVX2 CPU
without AVX-512, bfloat16 linear layers go through deepinfer's AVX2 kernel (``cpu_bf16``) or, for
many rows, compute in float32; on an AVX-512 CPU, those of a few rows go through the kernel."""
from __future__ import annotations

import functools
import logging
import os
import sys

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Device
from deepinfer_builtin.devices import cpu_bf16
from deepinfer_builtin.devices.cpu_invariant import invariant_linear

log = logging.getLogger("deepinfer")

#: weight elements widened to float32 at a time (2 MiB): a piece stays in cache for its matmul
WIDEN_CHUNK = 1 << 19


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def slow_bf16_matmul() -> bool:
    """Whether torch's bfloat16 matmul converts as it goes here, at a cost per row: an x86 CPU with
    AVX2 but no AVX-512 (so no AVX512-BF16 or AMX either), as measured on this project's AVX2 EPYC.
    Elsewhere (AVX-512 machines, whose oneDNN has bfloat16 kernels; other architectures) torch's
    matmul is left alone."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx2_supported", lambda: False)() and not cpu._is_avx512_supported())


def native_bf16_matmul() -> bool:
    """Whether this is an x86 CPU with AVX2 and AVX-512, whose oneDNN has bfloat16 matmul kernels:
    there torch's bfloat16 matmul costs little more for a few rows than for one, and a draft
    step's in bfloat16 beat float32's (1.2 ms against 3.0, the demo draft's compiled step, session
    38), though deepinfer's kernel is faster still for a few rows (``AVX512_KERNEL_ROWS``)."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx2_supported", lambda: False)()
                and getattr(cpu, "_is_avx512_supported", lambda: False)())


#: on an AVX-512 CPU, the rows up to which deepinfer's kernel is the default for bfloat16 linear
#: layers, by its build (docs/benchmarks.md, session 38, the demo pair's shapes against torch's
#: matmul): with AVX512-BF16 (VDPBF16PS) it was 2.5-3x faster at 1 row and ahead to 16 rows,
#: even at 24 and behind from 32; the AVX2 build (blocks of 3 rows) was ahead at 1-4 rows and
#: even at 5-6. Either takes a whole verification of 5 drafts at batch 1. With AMX's tiles (session
#: 50): 2-3x faster than torch's matmul (oneDNN, AMX too) to 16 rows, ahead to 64, even at 128; in
#: the engine at 64 requests no faster than torch's, so 32.
AVX512_KERNEL_ROWS = {"amx_bf16": 32, "avx512_bf16": 16, "avx2": 6}


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   from_rows: int, chunk: int = WIDEN_CHUNK) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; for bfloat16 x and weight and at least ``from_rows`` rows of
    x, computed in float32 a piece of the weight (about ``chunk`` elements) at a time, each piece's
    result rounded to bfloat16 once. On an AVX2 CPU torch's bfloat16 matmul costs in proportion to
    its rows (an 8192 x 384 weight: 0.5 ms for 1 row, 29 ms for 64), float32's far less (9 ms for
    64, widening included); for a few rows bfloat16, half the bytes, is the faster. Under
    torch.compile it is F.linear (the pieces would unroll into the graph)."""
    rows = x.numel() // x.shape[-1]
    if (x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or rows < from_rows
            or torch.compiler.is_compiling()):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1]).float()
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    step = max(1, chunk // weight.shape[1])
    for i in range(0, weight.shape[0], step):
        piece = torch.mm(flat, weight[i:i + step].float().t())
        if bias is not None:
            piece += bias[i:i + step]
        out[:, i:i + step] = piece  # float32 only a piece at a time: no float32 copy of the output
    return out.reshape(*x.shape[:-1], weight.shape[0])


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kernel_rows: int,
                from_rows: int, chunk: int = WIDEN_CHUNK) -> torch.Tensor:
    """The `cpu` device's linear for bfloat16 models: up to ``kernel_rows`` rows through deepinfer's
    AVX2 kernel (``cpu_bf16.bf16_linear``; its operator under torch.compile, ``cpu_bf16.compiled_op``), more through
    ``widened_linear`` (float32 from ``from_rows`` rows; F.linear under torch.compile). Other dtypes
    and products that need gradients take F.linear."""
    if (x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return F.linear(x, weight, bias)
    if kernel_rows and x.numel() <= kernel_rows * x.shape[-1]:
        if torch.compiler.is_compiling():
            return cpu_bf16.compiled_op()(x, weight, bias)
        return cpu_bf16.bf16_linear(x, weight, bias)
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    return widened_linear(x, weight, bias, from_rows=from_rows, chunk=chunk)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


class CPUOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bf16_kernel_rows: int | None = Field(None, ge=0, description="bfloat16 linear layers of at most this many "
                                         "rows go through deepinfer's kernel, compiled at first use (torch."
                                         "utils.cpp_extension, the C++ compiler); default: 128 on an x86 CPU with AVX2 and no AVX-512 (where "
                                         "torch's bfloat16 matmul costs in proportion to its rows); on one "
                                         "with AVX-512, 32 with AMX-BF16 (the kernel's tiles), 16 with "
                                         "AVX512-BF16 (its VDPBF16PS build), else 6; none elsewhere; 0: never")
    bf16_float32_rows: int = Field(4, ge=0, description="on such a CPU, bfloat16 linear layers of more rows "
                                   "than the kernel takes (all, where it is off or cannot be built) and at "
                                   "least this many compute in float32; 0: never")


class CPUDevice(Device):
    """Runs on the host CPU with torch's CPU kernels; the default where no accelerator is usable."""

    name = "cpu"
    Options = CPUOptions
    specificity = 0
    default_attention = "torch"
    dist_backend = "gloo"
    asynchronous = False  # a step has finished when its Python call returns

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def kv_cache_budget(self, model_bytes: int) -> int:
        cfg = self.ctx.config
        if cfg.kv_cache_memory_gb is not None:
            return int(cfg.kv_cache_memory_gb * (1 << 30))
        # an eighth of what is free, at most 1 GiB: the CPU is shared with everything else, and
        # small models need little (the demo model keeps ~260K tokens of bf16 KV in 1 GiB)
        return min(1 << 30, _available_memory() // 8)

    def _kernel_rows(self, dtype: torch.dtype) -> int:
        """Rows up to which linear layers of ``dtype`` go through deepinfer's kernel here (0: none)."""
        kernel_rows = self.options.bf16_kernel_rows
        if kernel_rows is None:
            kernel_rows = 128 if slow_bf16_matmul() else \
                AVX512_KERNEL_ROWS.get(cpu_bf16.kernel_kind(), 0) if native_bf16_matmul() else 0
        if dtype != torch.bfloat16 or kernel_rows == 0:
            return 0
        if (why := cpu_bf16.unavailable_reason()) is not None:
            from_rows = self._float32_rows()
            _warn_once(f"cpu: deepinfer's bfloat16 kernel cannot be used ({why}); bfloat16 linear layers take "
                       "torch's matmul" + (f", or float32 from {from_rows} rows" if from_rows else ""))
            return 0
        return kernel_rows

    def _float32_rows(self) -> int:
        """Rows from which bfloat16 linear layers compute in float32 (0: never): only where torch's
        bfloat16 matmul costs in proportion to its rows (``slow_bf16_matmul``)."""
        return self.options.bf16_float32_rows if slow_bf16_matmul() else 0

    def batch_invariance_unavailable(self) -> str | None:
        return None

    def linear_op(self, dtype: torch.dtype):
        if getattr(getattr(self.ctx, "config", None), "batch_invariant", False):  # (every dtype: see cpu_invariant)
            return invariant_linear
        if dtype != torch.bfloat16:
            return None
        kernel_rows, from_rows = self._kernel_rows(dtype), self._float32_rows()
        if kernel_rows == 0 and from_rows == 0:
            return None
        return functools.partial(bf16_linear, kernel_rows=kernel_rows, from_rows=from_rows or sys.maxsize)

    def draft_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """A half-precision target's draft runs in float32 here, unless deepinfer's kernel takes its
        steps or (bfloat16) torch has bfloat16 kernels (an AVX-512 CPU): elsewhere torch's
        half-precision single-token matmuls are no faster than float32's."""
        if dtype == torch.bfloat16 and (self._kernel_rows(dtype) or native_bf16_matmul()):
            return dtype
        if dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        return dtype

    @property
    def num_threads(self) -> int:
        return torch.get_num_threads() or os.cpu_count() or 1
