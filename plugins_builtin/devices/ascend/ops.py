"""Where the ascend plugins reach torch-npu: one lazy import, the kernels' documented limits, and
the documentation each call follows.

Nothing here imports ``torch_npu`` at module import time. The attention backend asks
``AscendAttention.kernels()`` for the module that provides the ops; that is ``torch_npu`` on an
Ascend machine and a CPU stand-in in the tests (tests/plugins/ascend/standins.py).
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

import torch

INSTALL_HINT = ("torch_npu is not installed; install it with `pip install deepinfer[ascend]` "
                "(needs the Ascend CANN toolkit)")

#: The documentation whose signatures and semantics each torch-npu call follows. None of these
#: calls has run on Ascend hardware from this project; see docs/devices/ascend.md.
DOCUMENTED_AT = {
    "npu_fused_infer_attention_score": (
        "Ascend Extension for PyTorch 7.0.0 API reference (torch-npu 2.5.1/2.6.0), "
        "hiascend.com/document/detail/zh/Pytorch/700/apiref/apilist/ptaoplist_001232.html, and "
        "Ascend/op-plugin docs/context/torch_npu-npu_fused_infer_attention_score.md (keyword `scale`; "
        "6.0.x named it `scale_value`). TND with block_table follows vllm-ascend's use on CANN 8.3; "
        "sparse_mode 3/4 semantics: hicann/ops-transformer docs/en/context/sparse_mode_introduction.md"),
    "npu_scatter_pa_kv_cache": (
        "Ascend/op-plugin docs/context/torch_npu-npu_scatter_pa_kv_cache.md, scenario 2 "
        "(key [T, N, D], caches [blocks, block_size, N, D], slot_mapping [T] int32/int64)"),
    "_npu_reshape_and_cache": (
        "Ascend/op-plugin ATB registration `_npu_reshape_and_cache(Tensor key, Tensor value, "
        "Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_indices) -> ()` (int32 slots), as "
        "vllm-ascend calls it with torch-npu 2.5.1 and later"),
    "npu_rms_norm": ("Ascend Extension for PyTorch 7.0.0 tuning guide (performance_tuning_0031): "
                     "npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)"),
    "npu_add_rms_norm": "torch-npu 7.0.0: npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6) -> (y, rstd, x1 + x2)",
    "npu_rotary_mul": ("Ascend/op-plugin docs/context/torch_npu-npu_rotary_mul.md: "
                       "npu_rotary_mul(input, r1, r2, rotary_mode='half'), 4-D BSND input, r1/r2 1S1D"),
}


class TorchNPUMissing(ImportError):
    """torch_npu cannot be imported; the message says what to install or fix."""


def torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


def import_torch_npu() -> ModuleType:
    """Import torch_npu now (only when an ascend plugin is selected), or raise TorchNPUMissing."""
    if not torch_npu_installed():
        raise TorchNPUMissing(INSTALL_HINT)
    try:
        return importlib.import_module("torch_npu")
    except Exception as e:  # a broken CANN shows up here as any kind of error
        raise TorchNPUMissing(f"importing torch_npu failed: {type(e).__name__}: {e} (is the CANN "
                              "toolkit installed and its set_env.sh sourced?)") from e


@dataclass(frozen=True, slots=True)
class KernelLimits:
    """What the fused kernels accept, from their documentation; checked before anything heavy runs."""

    block_sizes: tuple[int, ...]
    head_dims: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]

    def check_block_size(self, block_size: int) -> None:
        if block_size not in self.block_sizes:
            raise ValueError(
                f"the ascend attention backend needs block_size in {list(self.block_sizes)} "
                f"(npu_fused_infer_attention_score's paged mode takes multiples of 128 up to 512), "
                f"got {block_size}; set block_size: 128 (--block-size 128)")

    def check_layer(self, head_dim: int, dtype: torch.dtype) -> None:
        if head_dim not in self.head_dims:
            raise ValueError(f"the ascend attention backend supports head_dim {list(self.head_dims)} "
                             f"(TND layout of npu_fused_infer_attention_score), this model has {head_dim}")
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            raise ValueError(f"the ascend attention backend runs in {names}, not "
                             f"{str(dtype).removeprefix('torch.')}; set dtype: bfloat16 (--dtype bfloat16)")


# block sizes: "block_size最小为128，最大为512，且要求是128的倍数" (page attention constraints);
# head dims: TND accepts D of 64, 128 or 192 (CANN's CheckInputShapeWhenLayoutIsTND message);
# dtypes: query supports float16 and bfloat16 on Atlas A2/A3.
TORCH_NPU_LIMITS = KernelLimits(block_sizes=(128, 256, 384, 512), head_dims=(64, 128, 192),
                                dtypes=(torch.float16, torch.bfloat16))
