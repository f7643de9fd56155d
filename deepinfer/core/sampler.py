"""From logits to tokens: penalties, temperature, top-k/top-p/min-p, seeded sampling, logprobs.

Every row is processed on its own (no reduction across rows), and a request with a seed draws
from its own generator, so its tokens do not depend on what it is batched with.

Rows without penalties or a held-back EOS are sampled together on the logits' device, the CPU or
a CUDA GPU (``sample_batch``): the host draws one uniform number a sampled row from the request's generator
and sends them with the rows' temperatures and filters in one copy; temperature, top-k, top-p,
min-p and the inverse-CDF draw then run as a few batched ops, and the tokens stay on the device
(so a step of sampled requests keeps overlap scheduling, as a greedy one does). Other rows run one
by one on the host (``_sample_row``).
"""
from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.request import Request


def apply_penalties(logits: torch.Tensor, req: Request) -> torch.Tensor:
    p = req.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.all_token_ids)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if p.presence_penalty or p.frequency_penalty:
        out = req.output_token_ids
        if out:
            ids = torch.tensor(out, dtype=torch.long, device=logits.device)
            counts = torch.zeros_like(logits).index_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
            logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask tokens outside top-k, the top-p nucleus and the min-p floor with -inf (one row)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens strictly before it already reach top_p
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    """Samples one token per row; ``generator`` serves requests without their own seed."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        #: row-wise argmax of logits [B, V] (a device's fused kernel replaces it; same results);
        #: one that takes ``out=`` (an int64 tensor [B]) writes the tokens there
        self.argmax: Callable[..., torch.Tensor] = torch_argmax
        self._out_known: tuple[Callable[..., torch.Tensor], bool] | None = None  # (argmax, takes out=)

    def __call__(self, logits: torch.Tensor, requests: Sequence[Request]) -> tuple[list[int], list[TokenLogprobs | None]]:
        logits = logits.float()
        want_logprobs = any(r.params.logprobs is not None for r in requests)
        raw_logprobs = logits.log_softmax(-1) if want_logprobs else None
        if plain_greedy(requests):
            tokens = self.argmax(logits).tolist()
        else:
            on_batch = batch_device(logits)
            together = [i for i, r in enumerate(requests) if on_batch and batchable(r)]
            tokens = [0] * len(requests)
            if together:
                rows = logits if len(together) == len(requests) else logits[together]
                drawn = self.sample_batch(rows, [requests[i] for i in together]).tolist()
                for i, t in zip(together, drawn, strict=True):
                    tokens[i] = t
            for i in sorted(set(range(len(requests))) - set(together)):
                tokens[i] = self._sample_row(logits[i].clone(), requests[i])
        logprobs: list[TokenLogprobs | None] = [None] * len(requests)
        if raw_logprobs is not None:
            for i, r in enumerate(requests):
                if r.params.logprobs is not None:
                    logprobs[i] = top_logprobs(raw_logprobs[i], tokens[i], r.params.logprobs)
        return tokens, logprobs

    def sample_on_device(self, logits: torch.Tensor, requests: Sequence[Request],
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """The same tokens as ``__call__`` (requests without logprobs), as an int64 tensor on the
        logits' device. When every request is plain greedy, or every one can be sampled in the
        batch (``batchable``), they never leave it, and are written into ``out`` if it is given
        (an int64 tensor [B] on that device); otherwise they come back in a new tensor."""
        if not plain_greedy(requests):
            if batch_device(logits) and all(batchable(r) for r in requests):
                tokens = self.sample_batch(logits.float(), requests)
                return tokens if out is None else out.copy_(tokens)
            tokens = self(logits, requests)[0]
            return torch.tensor(tokens, dtype=torch.long, device=logits.device)
        if out is None:
            return self.argmax(logits)
        if self._takes_out():
            return self.argmax(logits, out=out)
        return out.copy_(self.argmax(logits))  # an argmax without out=: one copy more

    def _takes_out(self) -> bool:
        fn = self.argmax
        if self._out_known is None or self._out_known[0] is not fn:
            try:
                takes = "out" in inspect.signature(fn).parameters
            except (TypeError, ValueError):  # no signature to read: do not guess
                takes = False
            self._out_known = (fn, takes)
        return self._out_known[1]

    def sample_batch(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """Every row's token [B] (int64, on the logits' device) for requests without penalties or
        a held-back EOS: greedy rows their argmax; sampled rows a draw from softmax(logits / T)
        after top-k, top-p (over the top-k's renormalised mass) and min-p (``distributions``), by
        the inverse CDF in vocabulary order of one uniform number from the request's generator
        (greedy rows draw none), as ``draw``: a row's token depends on its own parameters and
        number only, not on what it is batched with."""
        vocab = logits.shape[-1]
        host = sampling_rows(requests, vocab)
        unseeded = []  # sampled rows without a generator of their own: their numbers in one call
        for i, r in enumerate(requests):
            if r.greedy:
                continue
            if r.generator is None:
                unseeded.append(i)
            else:
                host[UNIFORM, i] = float(torch.rand(1, generator=r.generator, dtype=torch.float64))
        if unseeded:
            host[UNIFORM, unseeded] = torch.rand(len(unseeded), generator=self.generator, dtype=torch.float64).numpy()
        dev = send_rows(host, logits.device)
        return draw_rows(distributions(logits, dev, needs_sort(host, vocab), host), dev[UNIFORM])

    def _sample_row(self, row: torch.Tensor, req: Request) -> int:
        p = req.params
        if p.needs_penalties:
            row = apply_penalties(row, req)
        if _suppress_eos(req):
            stop_ids = [t for t in (*req.eos_token_ids, *p.stop_token_ids) if t < row.shape[-1]]
            row[stop_ids] = float("-inf")
        if p.greedy:
            return int(row.argmax())
        row = filter_logits(row / p.temperature, p.effective_top_k, p.top_p, p.min_p)
        return draw(row.softmax(-1).cpu(), req.generator or self.generator)  # one generator per request


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index drawn from the distribution ``probs`` [V] (on the host; it need not sum to
    exactly 1) by its inverse CDF: one uniform number from ``generator``, a float64 cumulative sum
    and a binary search. On this project's CPU that takes about 20 us for 8,192 entries, against 170 us
    for an exponential race (argmax of p / E, E ~ Exp(1): one random number an entry), which the
    samplers used before. An entry of probability 0 is never drawn: the search returns the first
    entry whose cumulative sum exceeds the draw, and such an entry's sum equals the one before it."""
    i = int(_search(probs.double().cumsum(0), torch.rand(1, generator=generator, dtype=torch.float64)))
    return i if i < probs.numel() else int(probs.argmax())  # (no mass at all)


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
    plain = probs  # the rows that do not sort
    if any_min_p:
        plain = probs * (probs >= min_p[:, None].float() * probs.max(-1, keepdim=True).values)
    if not sort:
        return plain
    if host is not None and x.device.type == "cpu":
        rows = torch.from_numpy(np.flatnonzero((host[TOP_K] < vocab) | (host[TOP_P] < 1.0)))
        kept = _cpu_nucleus(x[rows], probs[rows], top_k[rows], top_p[rows], min_p[rows], any_min_p)
        return kept if len(rows) == len(x) else plain.index_copy(0, rows, kept)
    order = x.sort(dim=-1, descending=True, stable=True).indices
    p, keep = _sorted_filter(order, probs, top_k, top_p, min_p, any_min_p, vocab)
    weights = torch.empty_like(probs).scatter_(1, order, p * keep)  # back in vocabulary order
    return torch.where(sorts_rows(dev, vocab)[:, None], weights, plain)


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
        if done.any():
            out.index_copy_(0, fits[done], torch.zeros_like(probs[fits[done]]).scatter_(1, order[done], (p * keep)[done]))
            todo = todo[~torch.isin(todo, fits[done])]
            nucleus_rows[count] += int(done.sum())
    if len(todo):
        nucleus_rows[vocab] += len(todo)
        order = x[todo].sort(dim=-1, descending=True, stable=True).indices
        p, keep = _sorted_filter(order, probs[todo], top_k[todo], top_p[todo], min_p[todo], any_min_p, vocab)
        out.index_copy_(0, todo, torch.empty_like(probs[todo]).scatter_(1, order, p * keep))
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


def sample_rows(logits: torch.Tensor, requests: Sequence[Request],
                uniforms: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B] int64, their distributions [B, V] float32), on the logits' device: each row's
    sampling distribution (``distributions``) and a token drawn from it by the inverse CDF of the
    row's uniform number, for a caller that keeps its own generators and needs the distribution
    too (a draft model, whose ``q`` the rejection sampler reads). Rows on a device other than the
    CPU or a CUDA GPU are computed on the CPU (``batch_device``)."""
    if not batch_device(logits):
        logits = logits.cpu()
    vocab = logits.shape[-1]
    host = sampling_rows(requests, vocab)
    host[UNIFORM] = uniforms
    dev = send_rows(host, logits.device)
    probs = distributions(logits, dev, needs_sort(host, vocab), host)
    return draw_rows(probs, dev[UNIFORM]), probs


def draw_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Each row's index [R] (int64) drawn from distributions ``probs`` [R, V] by the inverse CDF
    of its uniform number ``uniforms`` [R] (float64, on the same device), as ``draw``."""
    return _search(probs.cumsum(-1, dtype=torch.float64), uniforms[:, None])[:, 0]


def _search(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The entries that uniform numbers ``u`` in [0, 1) pick from cumulative sums ``cdf`` (float64,
    over the last dimension; ``u`` with a last dimension of 1): the first entry whose sum exceeds
    u times the whole. The point searched for stays below the whole sum (u times it may round up
    to it), so it lands on an entry with mass, never past the last one that has any."""
    total = cdf[..., -1:]
    return torch.searchsorted(cdf, torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total))),
                              right=True)


def torch_argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise argmax of logits [B, V], into ``out`` when given. On the CPU through ``torch.max``,
    whose indices are argmax's (the first of tied maxima, a NaN first) and which took 9 against 31
    us for a bfloat16 row of 8,192 logits, 17 against 120 for four rows and 210 against 962 for 64
    (torch 2.13, session 50)."""
    if logits.device.type == "cpu":
        best = torch.max(logits, -1).indices
        return best if out is None else out.copy_(best)
    return logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out)


def batch_device(logits: torch.Tensor) -> bool:
    """Whether ``Sampler.sample_batch`` runs where these logits are: on the CPU and CUDA devices,
    where its float64 sums and searches were tested. Elsewhere (an NPU) rows go to the host one by
    one, as they did before the batched path."""
    return logits.device.type in ("cpu", "cuda")


def batchable(req: Request) -> bool:
    """Whether ``Sampler.sample_batch`` samples this request's row: no penalties, no EOS held back."""
    return not req.params.needs_penalties and not _suppress_eos(req)


def plain_greedy(requests: Sequence[Request]) -> bool:
    """Every row's token is its argmax: greedy, no penalties, no EOS held back (Request.plain_from)."""
    return all(r.greedy and len(r.all_token_ids) >= r.plain_from for r in requests)


def _suppress_eos(req: Request) -> bool:
    return req.num_output_tokens < req.params.min_tokens


def top_logprobs(row_logprobs: torch.Tensor, token: int, k: int) -> TokenLogprobs:
    """The sampled token's logprob (and rank) first, then the k most likely tokens."""
    return rows_top_logprobs(row_logprobs[None], [token], k)[0]


def rows_top_logprobs(logprobs: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """``top_logprobs`` of each row of ``logprobs`` for its token in ``tokens`` (as many), with one
    copy to the host for their logprobs and ranks, and one for the k likeliest."""
    logprobs = logprobs.float()  # (the ranks ride in float32: exact below 2^24, past any vocabulary)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=logprobs.device)[:, None])  # [n, 1]
    ranks = (logprobs >= chosen).sum(-1).float()  # (vLLM's: a tie takes the lower place)
    values, places = torch.stack([chosen[:, 0], ranks]).tolist()  # (one copy for both)
    out = [TokenLogprobs(((t, v),), int(r)) for t, v, r in zip(tokens, values, places, strict=True)]
    if k:
        vals, idx = torch.topk(logprobs, k, dim=-1)
        for row, ids, vs in zip(out, idx.tolist(), vals.tolist(), strict=True):
            row.top = tuple(ids)
            for t, v in zip(ids, vs, strict=True):
                row.setdefault(t, v)
    return out
