"""Routed mixture of experts as DeepSeek-V2/V3 have it: the router (``route``), the experts' weights
stacked per layer, a vectorised torch reference of their computation (``moe_experts``), shared
experts, and per-expert load counters.

Expert weights are stacked per layer so that a fused kernel can take them whole: ``w13`` [E, 2I, D]
(each expert's gate rows, then its up rows) and ``w2`` [E, D, I]. Where the device's fused ops offer
``fused_moe(x [T, D], w13, w2, topk_weights [T, K] float32, topk_ids [T, K] int32) -> [T, D]``
(read with ``getattr``, as the FusedOps protocol's optional members are), it replaces
``moe_experts``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.core.fused_ops import FusedOps
from deepinfer.models.layers import GatedMLP


@dataclass(frozen=True, slots=True)
class Routing:
    """How a layer's router picks its top-k experts.

    ``scoring`` "softmax" (DeepSeek-V2: the top-k of the softmax, within the best ``topk_group`` of
    ``n_group`` groups by their best expert when ``group_limited``) or "sigmoid" (DeepSeek-V3: the
    top-k of sigmoid + ``e_score_correction_bias``, within the best groups by the sum of their two
    best experts; the weights are the sigmoids without the bias)."""

    top_k: int
    scoring: str
    n_group: int = 1
    topk_group: int = 1
    group_limited: bool = False
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0


def _keep_groups(choice: torch.Tensor, group_scores: torch.Tensor, topk_group: int, fill: float) -> torch.Tensor:
    """``choice`` [T, E] with the experts outside each row's best ``topk_group`` groups set to ``fill``."""
    t, n_group = group_scores.shape
    best = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    keep = keep[:, :, None].expand(t, n_group, choice.shape[1] // n_group).reshape(t, choice.shape[1])
    return choice.masked_fill(~keep, fill)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``x.sigmoid()`` with each row's bits independent of the other rows: torch's CPU kernels compute
    a tensor's elements past its last whole pair of vectors with scalar code, whose bits differ from
    the vectorised code's, so rows of a width that is not a multiple of 32 (8 experts) would get
    other bits alone than in a batch; here every row sits in whole vectors."""
    pad = -x.shape[-1] % 32
    if pad == 0 or x.device.type != "cpu":
        return x.sigmoid()
    return F.pad(x, (0, pad)).sigmoid()[..., :x.shape[-1]]


def route(router_logits: torch.Tensor, routing: Routing,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and their weights from the router's logits [T, E]:
    (topk_weights float32 [T, K], topk_ids int32 [T, K]), the routed scaling factor in."""
    logits = router_logits.float()
    t, e = logits.shape
    if routing.scoring == "softmax":
        scores = logits.softmax(dim=-1)
        choice = scores
        if routing.group_limited:
            groups = scores.view(t, routing.n_group, e // routing.n_group).amax(dim=-1)
            choice = _keep_groups(scores, groups, routing.topk_group, 0.0)
        weights, ids = choice.topk(routing.top_k, dim=-1, sorted=False)
    elif routing.scoring == "sigmoid":
        scores = _sigmoid(logits)
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if routing.n_group > 1:
            groups = choice.view(t, routing.n_group, e // routing.n_group).topk(2, dim=-1).values.sum(dim=-1)
            choice = _keep_groups(choice, groups, routing.topk_group, float("-inf"))
        ids = choice.topk(routing.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
    else:
        raise ValueError(f"router scoring {routing.scoring!r} is not supported; supported: softmax, sigmoid")
    if routing.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing.routed_scaling_factor, ids.to(torch.int32)


def physical_expert_ids(topk_ids: torch.Tensor, logical_to_physical: torch.Tensor,
                        logical_replica_count: torch.Tensor) -> torch.Tensor:
    """Each (token, expert) pair's physical replica under an expert placement (EPLB): the i-th pair
    of logical expert e, in token order, goes to e's replica i mod count[e], so that e's replicas
    get its tokens within one of each other, the same way whatever the device. ``topk_ids`` int32
    [T, K] (logical), ``logical_to_physical`` [E, max_replicas] (a layer's slots of each expert, -1
    padded), ``logical_replica_count`` [E]; int32 [T, K] physical ids. No host sync."""
    flat = topk_ids.reshape(-1).long()
    pairs = torch.zeros(logical_replica_count.shape[0], dtype=torch.int64, device=flat.device)
    pairs.index_add_(0, flat, torch.ones_like(flat))
    first = pairs.cumsum(0) - pairs                          # where each expert's pairs start, sorted
    order = flat.argsort(stable=True)
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - first[flat[order]]
    replica = rank % logical_replica_count[flat]
    return logical_to_physical[flat, replica].view(topk_ids.shape).to(torch.int32)


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, linear: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """The routed experts' weighted sum for each token, in torch: the (token, expert) pairs sorted by
    expert, each expert's rows through its gate/up and down projections in one matmul each (``linear``,
    F.linear by default), the results scaled by their weights (in float32) and added back to their
    tokens, each token's in the order of its experts' ids. [T, D]."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = flat.argsort(stable=True)
    rows = x[order // k]                                    # the pairs' tokens, expert by expert
    out_rows = sorted_expert_rows(rows, torch.bincount(flat, minlength=w13.shape[0]).tolist(), w13, w2, linear)
    scaled = (out_rows.float() * topk_weights.reshape(-1)[order, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, order // k, scaled)


def sorted_expert_rows(rows: torch.Tensor, counts: list[int], w13: torch.Tensor, w2: torch.Tensor,
                       linear: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """Rows [N, D] sorted by expert (``counts[e]`` of expert e's, in expert order) through their
    expert's gate/up and down projections, one matmul each an expert (``linear``, F.linear by
    default), unweighted. [N, D]."""
    inter = w2.shape[2]
    linear = linear or F.linear
    out_rows = torch.empty_like(rows)
    start = 0
    for expert, n in enumerate(counts):
        if n:
            part = rows[start:start + n]
            gate, up = linear(part, w13[expert]).split(inter, dim=-1)
            out_rows[start:start + n] = linear(F.silu(gate) * up, w2[expert])
            start += n
    return out_rows


class Router(nn.Module):
    """The router's weight [E, D] and, for sigmoid scoring, its correction bias [E]; both float32."""

    def __init__(self, hidden: int, num_experts: int, routing: Routing) -> None:
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(num_experts)) if routing.scoring == "sigmoid"
                                        else None)
        self.linear_op: Callable[..., torch.Tensor] | None = None  # the device's matmul (use_linear_op)

    def forward(self, x: torch.Tensor, grouped_topk: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights float32 [T, K], topk_ids int32 [T, K]); by the device's ``grouped_topk`` kernel
        where it offers one (FusedOps), else by ``route``."""
        logits = (self.linear_op or F.linear)(x.float(), self.weight.float())
        if grouped_topk is None:
            return route(logits, self.routing, self.e_score_correction_bias)
        r = self.routing
        groups = r.n_group if r.group_limited or r.scoring == "sigmoid" else 1
        return grouped_topk(logits, r.top_k, scoring=r.scoring, n_group=groups,
                            topk_group=r.topk_group if groups > 1 else 1, correction_bias=self.e_score_correction_bias,
                            renormalize=r.norm_topk_prob, routed_scaling_factor=r.routed_scaling_factor)


class MoE(nn.Module):
    """Routed experts (stacked weights ``w13``, ``w2``) plus shared experts; counts each expert's tokens
    in ``expert_load`` (on the device, never read in a step)."""

    def __init__(self, hidden: int, num_experts: int, intermediate: int, num_shared: int, routing: Routing) -> None:
        super().__init__()
        self.gate = Router(hidden, num_experts, routing)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.shared_experts = GatedMLP(hidden, intermediate * num_shared) if num_shared else None
        self.register_buffer("expert_load", torch.zeros(num_experts, dtype=torch.int64), persistent=False)
        # (expanded: a count of one per slot; set with the counters in reset_load, since a model
        # built on the meta device gets its buffers uninitialised)
        self.register_buffer("one", torch.ones((), dtype=torch.int64), persistent=False)
        self.fused_ops: FusedOps | None = None
        self.linear_op: Callable[..., torch.Tensor] | None = None  # the experts' matmul (use_linear_op)

    def reset_load(self) -> None:
        """Every expert's count back to zero."""
        self.expert_load.zero_()
        self.one.fill_(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(x, getattr(self.fused_ops, "grouped_topk", None))
        flat = topk_ids.reshape(-1)  # (int32: index_add_ takes it, and a stride-0 one, in one kernel)
        self.expert_load.index_add_(0, flat, self.one.expand(flat.shape[0]))
        fused = getattr(self.fused_ops, "fused_moe", None)
        out = fused(x, self.w13, self.w2, topk_weights, topk_ids) if fused is not None else \
            moe_experts(x, self.w13, self.w2, topk_weights, topk_ids, self.linear_op)
        return out if self.shared_experts is None else self.shared_experts(x, add_to=out)
