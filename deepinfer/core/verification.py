"""Verification of draft tokens: one target forward, lossless acceptance.

Greedy requests keep drafts while they equal the target's argmax. Sampled requests use
rejection sampling: draft ``d`` drawn from ``q`` is kept with probability ``min(1, p(d) / q(d))``;
on rejection the token is drawn from ``max(p - q, 0)`` renormalised; when every draft is kept a
bonus token is drawn from ``p`` at the next position. The output then follows ``p`` exactly.

Sampled requests are verified together on the logits' device (``verify_batch``): their target
distributions, the acceptance tests, the residual and the last draw run as a few batched ops, and
one copy brings back each request's accepted count and last token. Each request takes
``len(drafts) + 1`` uniform numbers from its generator in one call, whatever the outcome, so its
tokens do not depend on the requests verified with it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from deepinfer.core.request import Request
from deepinfer.core.sampler import _search, batch_device
from deepinfer.core.sampling_filters import UNIFORM, distributions, needs_sort, sampling_rows, send_rows


def verify(logits: torch.Tensor, req: Request, drafts: list[int], q: torch.Tensor | None,
           generator: torch.Generator) -> list[int]:
    """Tokens the request gains: the accepted drafts, then one token from the target.

    ``logits`` has ``len(drafts) + 1`` rows: the target's next-token logits before each draft and
    after the last one. ``q`` [len(drafts), V] holds the distributions the drafts were drawn from
    (None: deterministic drafts, taken as one-hot).
    """
    if req.params.greedy:
        return accept_greedy(drafts, logits.argmax(-1).tolist())
    return verify_batch(logits, [(req, drafts, q)], generator)[0]


def verify_batch(logits: torch.Tensor, items: Sequence[tuple[Request, Sequence[int], torch.Tensor | None]],
                 generator: torch.Generator) -> list[list[int]]:
    """Rejection sampling for sampled requests (no penalties, no EOS held back), each item a
    (request, drafts, q) as ``verify`` takes them: ``logits`` holds each one's ``len(drafts) + 1``
    rows in turn. Requests without a generator of their own draw from ``generator``. Runs on the
    logits' device where ``Sampler.sample_batch`` does (``batch_device``), else on the CPU."""
    if not items:
        return []
    counts = [len(d) for _, d, _ in items]
    if min(counts) < 1:
        raise ValueError("verify_batch takes requests with at least one draft each")
    if not batch_device(logits):
        logits = logits.cpu()
    dev, vocab = logits.device, logits.shape[-1]
    host = sampling_rows([r for r, _, _ in items], vocab, [n + 1 for n in counts])
    starts = np.cumsum([0, *(n + 1 for n in counts)])  # each request's first logits row
    for (r, _, _), s, n in zip(items, starts, counts, strict=False):
        # this request's numbers: one to test each draft, then one for the token drawn at the end
        host[UNIFORM, s:s + n + 1] = torch.rand(n + 1, generator=r.generator or generator, dtype=torch.float64).numpy()
    rows = send_rows(host, dev)
    p = distributions(logits, rows, needs_sort(host, vocab), host)  # [R, V] the target's, as the sampler draws
    # the drafts' distributions [D, V]; deterministic drafts' rows (q None) are made one-hot below
    q = torch.cat([torch.zeros(n, vocab, device=dev) if qi is None else qi[:n].to(dev, torch.float32)
                   for (_, _, qi), n in zip(items, counts, strict=True)])
    num, longest = len(items), max(counts)
    index = np.zeros((5, sum(counts)), dtype=np.int64)  # each draft's token, p row, request, position, one-hot
    at = 0
    for b, ((_, d, qi), s, n) in enumerate(zip(items, starts, counts, strict=False)):
        index[:, at:at + n] = (d[:n], np.arange(s, s + n), np.full(n, b), np.arange(n), np.full(n, qi is None))
        at += n
    per_req = np.stack((starts[:-1], np.cumsum([0, *counts[:-1]]), counts))  # first p row, first q row, drafts
    index_dev = torch.from_numpy(np.concatenate((index.ravel(), per_req.ravel())))
    index_dev = (index_dev.pin_memory() if dev.type == "cuda" else index_dev).to(dev, non_blocking=True)
    token, p_row, req, pos, hot = index_dev[:index.size].view(5, -1)
    p_start, q_start, n = index_dev[index.size:].view(3, -1)
    draft_rows = torch.arange(len(token), device=dev)
    if index[4].any():  # (a deterministic draft has all its mass on its token)
        q[draft_rows, token] = torch.where(hot > 0, 1.0, q[draft_rows, token])
    # draft d is kept when u < p(d) / q(d), that is u q(d) < p(d)
    kept = rows[UNIFORM, p_row] * q[draft_rows, token] < p[p_row, token]
    grid = torch.zeros(num, longest + 1, dtype=torch.bool, device=dev)
    grid[req, pos] = kept
    accepted = (~grid).int().argmax(1)  # the first draft not kept (a column past the last is never kept)
    last = p[p_start + accepted]  # the target's distribution where the request's last token is drawn
    rejected = accepted < n
    residual = (last - q[q_start + torch.minimum(accepted, n - 1)]).clamp_min(0.0)
    dist = torch.where(rejected[:, None], residual, last)
    dist = torch.where(dist.sum(-1, keepdim=True) > 0, dist, last)  # (p equal to q there: nothing left over)
    drawn = _search(dist.cumsum(-1, dtype=torch.float64), rows[UNIFORM, p_start + n][:, None])[:, 0]
    accepted, drawn = torch.stack((accepted, drawn)).tolist()
    return [[*d[:a], t] for (_, d, _), a, t in zip(items, accepted, drawn, strict=True)]


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
