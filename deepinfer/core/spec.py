"""Verification of draft tokens: one target forward, lossless acceptance.

Greedy requests keep drafts while they equal the target's argmax. Sampled requests use
rejection sampling: draft ``d`` drawn from ``q`` is kept with probability ``min(1, p(d) / q(d))``;
on rejection the token is drawn from ``max(p - q, 0)`` renormalised; when every draft is kept a
bonus token is drawn from ``p`` at the next position. The output then follows ``p`` exactly.
"""
from __future__ import annotations

import torch

from deepinfer.core.request import Request
from deepinfer.core.sampler import draw, filter_logits


def target_probs(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """The target's sampling distribution at each row, as the sampler would draw from it."""
    p = req.params
    rows = [filter_logits(row / p.temperature, p.effective_top_k, p.top_p, p.min_p) for row in logits.float()]
    return torch.stack(rows).softmax(-1).cpu()


def verify(logits: torch.Tensor, req: Request, drafts: list[int], q: torch.Tensor | None,
           generator: torch.Generator) -> list[int]:
    """Tokens the request gains: the accepted drafts, then one token from the target.

    ``logits`` has ``len(drafts) + 1`` rows: the target's next-token logits before each draft and
    after the last one.
    """
    if req.params.greedy:
        return accept_greedy(drafts, logits.argmax(-1).tolist())
    p = target_probs(logits, req)
    gen = req.generator or generator
    out = []
    for i, d in enumerate(drafts):
        q_d = 1.0 if q is None else float(q[i, d])
        accept = min(1.0, float(p[i, d]) / q_d) if q_d > 0 else 0.0
        if torch.rand((), generator=gen).item() < accept:
            out.append(d)
            continue
        residual = p[i].clone()
        if q is None:
            residual[d] = 0.0
        else:
            residual = (residual - q[i].float().cpu()).clamp_min(0.0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[i]
        out.append(draw(dist, gen))
        return out
    out.append(draw(p[len(drafts)], gen))
    return out


def accept_greedy(drafts: list[int], best: list[int]) -> list[int]:
    """Greedy verification from the target's argmax at each of the ``len(drafts) + 1`` rows: the
    drafts while they equal it, then the target's token."""
    out = []
    for d, t in zip(drafts, best, strict=False):
        if d != t:
            break
        out.append(d)
    out.append(best[len(out)])
    return out
