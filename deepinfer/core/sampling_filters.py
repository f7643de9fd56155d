"""The batched sampling path's rows and filters: each row's parameters in one array
(``sampling_rows``, sent to the logits' device in one copy), and each row's distribution after its
temperature, top-k, top-p and min-p (``filtered_weights``, ``distributions``), computed row by row
so that a row's numbers do not depend on its batch. On the CPU a row with top-k or top-p looks for
its kept tokens among its largest logits before it sorts them all (``_cpu_nucleus``).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from deepinfer.core.request import Request

#: the rows of ``sampling_rows``' array
TEMPERATURE, TOP_K, TOP_P, MIN_P, UNIFORM, GREEDY = range(6)


def sampling_rows(requests: Sequence[Request], vocab: int, repeats: Sequence[int] | None = None) -> np.ndarray:
    """Each logits row's sampling parameters, float64 [6, rows] (indexed by ``TEMPERATURE``,
    ``TOP_K``, ``TOP_P``, ``MIN_P``, ``UNIFORM``, ``GREEDY``): request i's row, ``repeats[i]``
    times over (default once). Greedy requests get temperature 1 and no filter, flagged in
    ``GREEDY``; the ``UNIFORM`` row, zero here, is the caller's to fill with each row's uniform
    number, which then travels to the device with the rest in one copy (``send_rows``)."""
    cols = np.empty((6, len(requests)), dtype=np.float64)
    for i, r in enumerate(requests):
        p = r.params
        cols[:, i] = ((1.0, vocab, 1.0, 0.0, 0.0, 1.0) if r.greedy else
                      (p.temperature, p.effective_top_k or vocab, p.top_p, p.min_p, 0.0, 0.0))
    return cols if repeats is None else np.repeat(cols, repeats, axis=1)


def send_rows(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """``sampling_rows``' array on the device, without waiting for work queued there."""
    t = torch.from_numpy(host)
    # (pinned: a copy from pageable memory would wait for the work queued before it, a step in flight)
    return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)


def needs_sort(host: np.ndarray, vocab: int) -> bool:
    """Whether any row of ``sampling_rows``' array has a filter that needs its logits sorted
    (top-k below the vocabulary, top-p below 1)."""
    return bool((host[TOP_K] < vocab).any() or (host[TOP_P] < 1.0).any())


def sorts_rows(dev: torch.Tensor, vocab: int) -> torch.Tensor:
    """Which rows of ``sampling_rows``' array on the device have a filter that sorts their logits
    (top-k below the vocabulary, top-p below 1): bool [R]."""
    return (dev[TOP_K] < vocab) | (dev[TOP_P] < 1.0)


def filtered_weights(logits: torch.Tensor, dev: torch.Tensor, sort: bool,
                     host: np.ndarray | None = None) -> torch.Tensor:
    """Each row's probabilities after its temperature, top-k, top-p (over the top-k's renormalised
    mass) and min-p, not renormalised, in vocabulary order: float32 [R, V]. A row's numbers depend
    on its own parameters only, whatever it is batched with: its softmax is taken in vocabulary
    order, and a row with top-k or top-p on filters its tokens in the order of its logits, largest
    first (ties by token id: a stable sort), with the float64 running sum of their probabilities in
    that order (``_sorted_filter``). ``sort`` (``needs_sort``) says whether some row sorts; without
    it top-k and top-p must be off. ``dev`` is ``sampling_rows``' array on the logits' device.
    ``host``, that array on the host, lets the work that no row needs be skipped, and on the CPU
    lets a sorting row find its tokens among its largest logits (``_cpu_nucleus``) rather than sort
    them all; without it (in a device graph, whose work is fixed when it is captured) every filter
    and both ways run, which leaves a row that does not use one as it was: the same numbers either
    way."""
    vocab = logits.shape[-1]
    temp, top_k, top_p, min_p = dev[TEMPERATURE], dev[TOP_K], dev[TOP_P], dev[MIN_P]
    x = logits.float() / temp[:, None].float()
    any_min_p = host is None or bool(host[MIN_P].any())
    probs = x.softmax(-1)

    def plain() -> torch.Tensor:  # the rows that do not sort
        if not any_min_p:
            return probs
        return probs * (probs >= min_p[:, None].float() * probs.max(-1, keepdim=True).values)

    if not sort:
        return plain()
    if host is not None and x.device.type == "cpu":
        rows = torch.from_numpy(np.flatnonzero((host[TOP_K] < vocab) | (host[TOP_P] < 1.0)))
        kept = _cpu_nucleus(x[rows], probs[rows], top_k[rows], top_p[rows], min_p[rows], any_min_p)
        return kept if len(rows) == len(x) else plain().index_copy(0, rows, kept)
    order = x.sort(dim=-1, descending=True, stable=True).indices
    p, keep = _sorted_filter(order, probs, top_k, top_p, min_p, any_min_p, vocab)
    weights = torch.empty_like(probs).scatter_(1, order, p * keep)  # back in vocabulary order
    return torch.where(sorts_rows(dev, vocab)[:, None], weights, plain())


def _sorted_filter(order: torch.Tensor, probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor, any_min_p: bool, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the probabilities of tokens ``order`` [R, K], which lists each row's K largest logits in the
    stable sort's order, K <= V; which of them the row keeps: bool [R, K]). A token is kept when it
    is among the row's top k, the tokens before it hold less than ``top_p`` of the top k's mass (1
    where top-k is off), and its probability is at least ``min_p`` of the largest. The mass before
    a token is a float64 running sum from the largest, so the first K tokens' figures are the same
    whatever K (on the CPU, where a running sum adds in order); a row with top-k on needs K >= k."""
    p = probs.gather(1, order)
    mass = p.cumsum(-1, dtype=torch.float64)
    k = order.shape[1]
    keep = torch.arange(k, device=order.device)[None, :] < top_k[:, None]
    in_k = mass.gather(1, (top_k.long() - 1).clamp(0, k - 1)[:, None])  # the top-k's mass
    in_k = torch.where(top_k[:, None] < vocab, in_k, torch.ones_like(in_k))
    keep &= (mass - p) < top_p[:, None] * in_k
    if any_min_p:  # (min-p's ratio is the same after renormalising)
        keep &= p >= min_p[:, None].float() * p[:, :1]
    return p, keep


#: how many of a row's largest logits ``_cpu_nucleus`` tries, in turn, before sorting them all
#: (a count is skipped where it is more than a quarter of the vocabulary, or below the row's top-k)
CANDIDATES = (64, 512, 2048)
#: rows ``_cpu_nucleus`` has filtered in this process, by the candidates that sufficed (the
#: vocabulary's size: sorted whole)
nucleus_rows: Counter[int] = Counter()


def _largest(x: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``count`` largest values and their indices, whichever of equal values it takes."""
    return x.topk(count, dim=-1)


def _cpu_nucleus(x: torch.Tensor, probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor, any_min_p: bool) -> torch.Tensor:
    """``filtered_weights``' rows that sort, on the CPU, the same numbers as through a sort of the
    whole row: a row's K largest logits (``torch.topk``, a fraction of a sort's time: 64 rows of
    8,192 took 0.9 ms for K = 64 against 15 ms sorted) are put in the stable sort's order and
    filtered (``_sorted_filter``). Every token whose logit exceeds the K-th largest is among
    them, in the order a whole sort gives it; the tokens that tie with the K-th may be others than
    a sort would list there, so a row is done when none of those is kept (its filters cut before
    them, and so before every token left out). Other rows try the next count of ``CANDIDATES``,
    then a whole sort. A row's path depends on its own logits and filters only."""
    rows, vocab = x.shape
    out = torch.zeros_like(probs)
    todo = torch.arange(rows)
    for count in CANDIDATES:
        if count * 4 > vocab or not len(todo):
            break
        fits = todo[(top_k[todo] <= count) | (top_k[todo] >= vocab)]  # (a top-k above count waits)
        if not len(fits):
            continue
        values, tokens = _largest(x[fits], count)
        tokens, by_token = tokens.sort(dim=-1)  # ties by token id, as the stable sort puts them
        values, by_value = values.gather(1, by_token).sort(dim=-1, descending=True, stable=True)
        order = tokens.gather(1, by_value)
        p, keep = _sorted_filter(order, probs[fits], top_k[fits], top_p[fits], min_p[fits], any_min_p, vocab)
        above = (values > values[:, -1:]).sum(-1, keepdim=True)  # the tokens surely in the sort's order
        # (a NaN or infinite largest logit makes the softmax NaN: such rows are sorted whole, as before)
        done = ~keep.gather(1, above)[:, 0] & values[:, 0].isfinite()
        finished = int(done.sum())
        if finished:
            out.index_copy_(0, fits[done], probs.new_zeros(finished, vocab).scatter_(1, order[done], (p * keep)[done]))
            todo = todo[~torch.isin(todo, fits[done])]
            nucleus_rows[count] += finished
    if len(todo):
        nucleus_rows[vocab] += len(todo)
        order = x[todo].sort(dim=-1, descending=True, stable=True).indices
        p, keep = _sorted_filter(order, probs[todo], top_k[todo], top_p[todo], min_p[todo], any_min_p, vocab)
        out.index_copy_(0, todo, probs.new_empty(len(todo), vocab).scatter_(1, order, p * keep))
    return out


def distributions(logits: torch.Tensor, dev: torch.Tensor, sort: bool, host: np.ndarray | None = None) -> torch.Tensor:
    """Each row's sampling distribution [R, V] (float32, in vocabulary order, summing to 1), as
    ``Sampler.sample_batch`` draws from it; greedy rows are one-hot at their argmax. Arguments
    as ``filtered_weights``': without ``host`` the same numbers, every step run; a row's numbers
    depend on its own parameters only."""
    weights = filtered_weights(logits, dev, sort, host)
    if host is None or sort or host[MIN_P].any():  # (rows that filter nothing keep the softmax's own sums)
        renorm = sorts_rows(dev, logits.shape[-1]) | (dev[MIN_P] > 0)
        weights = torch.where(renorm[:, None], weights / weights.sum(-1, keepdim=True), weights)
    if host is None or host[GREEDY].any():
        hot = torch.zeros_like(weights).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
        weights = torch.where(dev[GREEDY, :, None] > 0, hot, weights)
    return weights
