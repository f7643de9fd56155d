"""FusedOps: the fused kernels a device offers the models and the core (``Device.fused_ops``)."""
from __future__ import annotations

from typing import Protocol

from torch import Tensor


class FusedOps(Protocol):
    """Fused kernels for the models' norms, rotary embedding and activation, and optionally for
    steps of a few tokens, greedy sampling and the placeholder tokens of overlapped steps.

    ``rms_norm``, ``apply_rotary`` and ``silu_and_mul`` are required. An implementation may lack
    any other member or hold None there: the models and the core read those with
    ``getattr(ops, name, None)`` and run torch's equivalent without them. ``deepinfer_kernels.FusedOps``
    (the CUDA devices') implements them all; ``tests/core/test_capabilities.py`` checks it against
    these signatures. Tensors are on the device; T is a step's tokens, H and KV its heads.
    """

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float,
                 residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """RMSNorm of ``x`` over its last dimension; with ``residual``, (norm(x + residual), x + residual)."""
        ...

    def apply_rotary(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                     q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                     eps: float = 1e-6) -> tuple[Tensor, Tensor]:
        """Rotated q [T, H, D] and k [T, KV, D] at ``positions``; with per-head RMSNorm weights, normalised first."""
        ...

    def silu_and_mul(self, x: Tensor) -> Tensor:
        """silu(gate) * up of ``x`` = [gate | up], [T, 2I] -> [T, I]."""
        ...

    # --------------------------------------------------------------------------------- optional
    def gemv(self, x: Tensor, weight: Tensor, *, norm_weight: Tensor | None = None, eps: float = 1e-6,
             residual: Tensor | None = None, silu_mul: bool = False) -> Tensor:
        """x @ weight.T for one token (or ``takes_rows``' few): normed first, added into ``residual``, or silu-mul'd."""
        ...

    def gemv_qkv_rotary(self, x: Tensor, weight: Tensor, norm_weight: Tensor, eps: float, cos: Tensor, sin: Tensor,
                        positions: Tensor, num_heads: int, num_kv_heads: int, q_norm: Tensor | None = None,
                        k_norm: Tensor | None = None, qk_eps: float = 1e-6, *,
                        kv_cache: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """Normed qkv projection, q/k norms and rotary in one; with ``kv_cache`` (``FusedKVWrite``'s) k, v go there."""
        ...

    def takes_rows(self, rows: int, head_dim: int | None = None, weights: int | None = None) -> bool:
        """Whether ``gemv`` takes a step of ``rows`` tokens (heads of ``head_dim``, projections of ``weights``)."""
        ...

    def embedding(self, ids: Tensor, weight: Tensor) -> Tensor:
        """``weight[ids]``, used for the token embedding of a step of one token."""
        ...

    def argmax(self, logits: Tensor, *, out: Tensor | None = None) -> Tensor:
        """Each row's first maximum of logits [B, V], int64 [B] (into ``out``): greedy sampling uses it."""
        ...

    def argmax_prob(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """(probability, index) of each row's softmax maximum, as ``logits.float().softmax(-1).max(-1)``."""
        ...

    def resolve_placeholders(self, ids: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
        """``ids`` with each placeholder -(r+1) replaced by ``values[r]`` (into ``out``, which may be ``ids``)."""
        ...

    #: the most bytes a replay's inputs may take to be staged by ``stage_inputs``
    stage_max_bytes: int

    def stage_inputs(self, src: Tensor, turn: Tensor, dst: Tensor, n_ids: int, values: Tensor) -> Tensor:
        """A replay's first kernel: host inputs ``src[turn]`` into ``dst``, placeholders resolved, ``turn`` flipped."""
        ...

    def chain_inputs(self, base: Tensor, vrows: Tensor, drows: Tensor, best: Tensor, drafts: Tensor, tables: Tensor,
                     block_size: int, out: dict[str, Tensor]) -> None:
        """A chained draft round's inputs from a verification's argmaxes, into ``out`` (draft models' loop graphs)."""
        ...

    def grouped_topk(self, router_logits: Tensor, top_k: int, *, scoring: str = "softmax", n_group: int = 1,
                     topk_group: int = 1, correction_bias: Tensor | None = None, renormalize: bool = False,
                     routed_scaling_factor: float = 1.0) -> tuple[Tensor, Tensor]:
        """A MoE router's choice (DeepSeek-V2 softmax, V3 sigmoid with its correction bias, both
        within the best ``topk_group`` of ``n_group`` groups): (weights float32 [T, K], ids int32 [T, K])."""
        ...

    def fused_moe(self, x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
        """The routed experts' weighted sum [T, D]: ``w13`` [E, 2I, D] (gate rows, then up), ``w2`` [E, D, I]."""
        ...

    def fp8_block_linear(self, x: Tensor, weight: Tensor, weight_scale_inv: Tensor) -> Tensor:
        """x [T, K] @ W.T for a float8 (e4m3) ``weight`` [N, K] scaled per 128x128 block by
        ``weight_scale_inv`` [ceil(N/128), ceil(K/128)]; [T, N] in x's dtype."""
        ...

