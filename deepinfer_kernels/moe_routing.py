"""DeepSeek's expert routing: each token's top-k experts and their weights from the router logits.

- DeepSeek-V2 (``scoring="softmax"``): scores = softmax(logits). Greedy (``n_group=1``): the k best
  scores. Group-limited: the experts are split into ``n_group`` equal groups in order, a group's
  score is its best expert's, and only the ``topk_group`` best groups' experts are candidates.
- DeepSeek-V3 (``scoring="sigmoid"``, ``correction_bias`` [E]): scores = sigmoid(logits); experts
  are chosen on scores + correction_bias, a group's score is the sum of its two best biased
  scores; the weights are the chosen experts' unbiased scores.

The group score follows the bias, as in vLLM: with ``correction_bias`` the two-best sum, without it
the best score. Then, if ``renormalize``, the weights are divided by their sum (+ 1e-20), and
always multiplied by ``routed_scaling_factor``. transformers' DeepSeek-V2 router (and DeepSeek's
own, for the released V2 checkpoints, whose norm_topk_prob is false) scales without normalising;
DeepSeek's V2 code normalises instead of scaling when norm_topk_prob is set: pass
``routed_scaling_factor=1.0`` then. Everything is computed in float32 (the logits are cast first).

Ties break toward the lower index, for groups and for experts, in the kernel and the reference
alike; torch.topk (transformers) leaves the order of ties unspecified. Experts of dropped groups are
never chosen (transformers' V2 masks them with a score of 0.0, which only differs when fewer than
k candidates have a positive score: never with softmax scores). The ids come out in the order
chosen, best first.
"""
from __future__ import annotations

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _grouped_topk_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, stride_t, scale,
                         E: tl.constexpr, E_P: tl.constexpr, TOP_K: tl.constexpr, K_P: tl.constexpr,
                         N_GROUP: tl.constexpr, G_P: tl.constexpr, TOPK_GROUP: tl.constexpr,
                         SIGMOID: tl.constexpr, BIAS: tl.constexpr, RENORM: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_P)
    emask = e < E
    x = tl.load(logits_ptr + t * stride_t + e, mask=emask, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        p = tl.exp(x - tl.max(x, 0))
        s = p / tl.sum(p, 0)
    choice = s
    if BIAS:
        choice = s + tl.load(bias_ptr + e, mask=emask, other=0.0).to(tl.float32)
    choice = tl.where(emask, choice, float("-inf"))
    if N_GROUP > 1:
        g = tl.arange(0, G_P)
        member = (e[None, :] // (E // N_GROUP)) == g[:, None]  # [G_P, E_P]: expert e is in group g
        in_g = tl.where(member, choice[None, :], float("-inf"))
        best = tl.max(in_g, 1)
        if BIAS:  # the two best: the best's first index left out, the best of the rest added
            first = tl.min(tl.where(in_g == best[:, None], e[None, :], E_P), 1)
            best += tl.max(tl.where(e[None, :] == first[:, None], float("-inf"), in_g), 1)
        gscore = tl.where(g < N_GROUP, best, float("-inf"))
        kept = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(gscore, 0)
            gi = tl.min(tl.where(gscore == top, g, G_P), 0)
            kept = kept | (g == gi)
            gscore = tl.where(g == gi, float("-inf"), gscore)
        keep_e = tl.max(tl.where(member & kept[:, None], 1, 0), 0) > 0
        choice = tl.where(keep_e, choice, float("-inf"))
    kr = tl.arange(0, K_P)
    ids = tl.zeros([K_P], tl.int32)
    w = tl.zeros([K_P], tl.float32)
    for k in tl.static_range(TOP_K):
        top = tl.max(choice, 0)
        i = tl.min(tl.where(choice == top, e, E_P), 0)
        ids = tl.where(kr == k, i, ids)
        w = tl.where(kr == k, tl.sum(tl.where(e == i, s, 0.0), 0), w)
        choice = tl.where(e == i, float("-inf"), choice)
    if RENORM:
        w = w / (tl.sum(w, 0) + 1e-20)
    kmask = kr < TOP_K
    tl.store(weights_ptr + t * TOP_K + kr, w * scale, mask=kmask)
    tl.store(ids_ptr + t * TOP_K + kr, ids, mask=kmask)


def _check(router_logits, top_k, scoring, n_group, topk_group, correction_bias) -> None:
    if router_logits.dim() != 2:
        raise ValueError(f"grouped_topk takes router_logits [T, E]; got {tuple(router_logits.shape)}")
    e = router_logits.shape[1]
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"grouped_topk: scoring must be 'softmax' (DeepSeek-V2) or 'sigmoid' (V3); got {scoring!r}")
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"grouped_topk: {e} experts must split into n_group = {n_group} equal groups, of which "
                         f"1 <= topk_group <= n_group are kept; got topk_group = {topk_group}")
    if not 1 <= top_k <= e // n_group * topk_group:
        raise ValueError(f"grouped_topk: top_k = {top_k} must be between 1 and the experts of the kept groups "
                         f"({e // n_group * topk_group})")
    if correction_bias is not None:
        if correction_bias.shape != (e,) or correction_bias.device != router_logits.device:
            raise ValueError(f"grouped_topk: correction_bias must be [{e}] on {router_logits.device}; got "
                             f"{tuple(correction_bias.shape)} on {correction_bias.device}")
        if n_group > 1 and e // n_group < 2:
            raise ValueError("grouped_topk: with correction_bias a group's score is the sum of its two best "
                             f"experts; groups of {e // n_group} expert cannot have one")


def grouped_topk(router_logits: torch.Tensor, top_k: int, *, scoring: str = "softmax", n_group: int = 1,
                 topk_group: int = 1, correction_bias: torch.Tensor | None = None, renormalize: bool = False,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32 [T, top_k], topk_ids int32 [T, top_k]) of router_logits [T, E]; one
    program a token. See the module's docstring for the semantics."""
    _check(router_logits, top_k, scoring, n_group, topk_group, correction_bias)
    t, e = router_logits.shape
    dev = router_logits.device
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    if t == 0:
        return weights, ids
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    bias = correction_bias.contiguous() if correction_bias is not None else logits
    _grouped_topk_kernel[(t,)](
        logits, bias, weights, ids, logits.stride(0), float(routed_scaling_factor),
        E=e, E_P=next_pow2(e), TOP_K=top_k, K_P=next_pow2(top_k), N_GROUP=n_group, G_P=next_pow2(n_group),
        TOPK_GROUP=topk_group, SIGMOID=scoring == "sigmoid", BIAS=correction_bias is not None,
        RENORM=renormalize, num_warps=1 if e <= 256 else 4)
    return weights, ids


def grouped_topk_ref(router_logits, top_k, *, scoring="softmax", n_group=1, topk_group=1, correction_bias=None,
                     renormalize=False, routed_scaling_factor=1.0):
    """Torch reference of :func:`grouped_topk`: stable sorts (ties to the lower index)."""
    logits = router_logits.float()
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    t, e = choice.shape
    if n_group > 1:
        grouped = choice.view(t, n_group, e // n_group)
        if correction_bias is None:
            gscore = grouped.max(-1).values
        else:
            gscore = grouped.sort(dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
        kept = gscore.sort(dim=-1, descending=True, stable=True).indices[:, :topk_group]
        mask = torch.zeros(t, n_group, dtype=torch.bool, device=choice.device).scatter_(1, kept, True)
        choice = choice.masked_fill(~mask.repeat_interleave(e // n_group, 1), float("-inf"))
    ids = choice.sort(dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)
