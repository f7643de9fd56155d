"""FusedOps: the bundle of kernels the CUDA devices offer the models."""
from __future__ import annotations

from deepinfer_kernels._launch import pdl_supported
from deepinfer_kernels.gemv import gemv, gemv_qkv_rotary


class FusedOps:
    """The fused kernels a CUDA device hands to the models (see ``Device.fused_ops``).

    ``single_token_gemv``: offer ``gemv`` and ``gemv_qkv_rotary`` (the models then run steps of a
    single token through them; None otherwise). ``pdl``: launch those with programmatic dependent
    launch where the GPU supports it.
    """

    def __init__(self, single_token_gemv: bool = True, pdl: bool = True) -> None:
        from deepinfer_kernels.activation import silu_and_mul
        from deepinfer_kernels.argmax import argmax, argmax_prob
        from deepinfer_kernels.placeholders import STAGE_MAX_BYTES, resolve_placeholders, stage_inputs
        from deepinfer_kernels.rms_norm import rms_norm
        from deepinfer_kernels.rotary import apply_rotary

        self.rms_norm = rms_norm
        self.apply_rotary = apply_rotary
        self.silu_and_mul = silu_and_mul
        self.argmax = argmax
        self.argmax_prob = argmax_prob
        self.resolve_placeholders = resolve_placeholders
        self.stage_inputs = stage_inputs
        self.stage_max_bytes = STAGE_MAX_BYTES  # the most a step's staged inputs may take
        self.pdl = pdl
        self.gemv = self._gemv if single_token_gemv else None
        self.gemv_qkv_rotary = self._gemv_qkv_rotary if single_token_gemv else None

    def _gemv(self, x, weight, **kwargs):
        return gemv(x, weight, pdl=self.pdl and pdl_supported(x.device), **kwargs)

    def _gemv_qkv_rotary(self, x, weight, *args, **kwargs):
        return gemv_qkv_rotary(x, weight, *args, pdl=self.pdl and pdl_supported(x.device), **kwargs)
