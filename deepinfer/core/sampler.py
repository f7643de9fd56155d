"""From logits to tokens: penalties, temperature, top-k/top-p/min-p, seeded sampling, logprobs.

Every row is processed on its own (no reduction across rows), and a request with a seed draws
from its own generator, so its tokens do not depend on what it is batched with.

On the CPU and CUDA GPUs every row is sampled with the others on the logits' device
(``sample_batch``): a request's penalties and held-back EOS first change its row of a copy of the
logits (``adjusted``), then the host draws one uniform number a sampled row from the request's
generator and sends them with the rows' temperatures and filters in one copy; temperature, top-k,
top-p, min-p and the inverse-CDF draw run as a few batched ops, and the tokens stay on the device
(so a step of sampled requests without penalties keeps overlap scheduling, as a greedy one does;
penalties read the tokens of the step before from the host). On other devices
(an NPU) rows run one by one on the host (``_sample_row``).
"""
from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from deepinfer.core.grammar import constrained_rows, mask_rows
from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.request import Request
from deepinfer.core.sampling_filters import (
    UNIFORM,
    distributions,
    needs_sort,
    sampling_rows,
    send_rows,
)

#: the token a row gets when its logits cannot be sampled (NaN, +inf, or nothing above -inf, from
#: the model or from the request's own penalties): the engine ends that request alone with an error
UNUSABLE_TOKEN = -2


def apply_penalties(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """One row of logits [V] with the request's penalties applied, in place: a repetition penalty
    divides the positive logits of the tokens in its prompt and output (multiplies the negative
    ones); presence and frequency penalties subtract ``presence + frequency * count`` from the
    logit of each token its output holds (``count`` times)."""
    _adjust(logits[None], [(0, req)], stops=False)
    return logits


def adjusted(logits: torch.Tensor, requests: Sequence[Request], own: bool = False) -> torch.Tensor:
    """The logits [B, V] with each row's penalties applied and, while its EOS is held back
    (``min_tokens``), its stop tokens masked with -inf (``_adjust``), where some request has
    either: in a copy, or in place where the logits are ``own`` (a copy the caller made);
    otherwise these logits themselves. Every row's changes go in at once, by kind, from one copy
    to the device that waits for no work queued there."""
    rows = [(i, r) for i, r in enumerate(requests) if not batchable(r)]
    if not rows:
        return logits
    logits = logits if own else logits.clone()
    _adjust(logits, rows)
    return logits


def _adjust(logits: torch.Tensor, rows: Sequence[tuple[int, Request]], stops: bool = True) -> None:
    """Rows ``rows`` (index, request) of ``logits`` [B, V] adjusted in place: repetition penalties,
    then presence and frequency penalties, then (with ``stops``) the stop tokens of requests whose
    EOS is held back masked with -inf. Each kind is one indexed update over every row's (row,
    token) pairs, each pair listed once, its factors and terms in float32 (as a float32 row's
    arithmetic with the penalties as numbers). The pairs and factors of every kind
    travel in one float64 array (``filters.send_rows``: pinned, not waiting, on a CUDA device)."""
    rep: tuple[list, ...] = ([], [], [])          # row, token, penalty
    pen: tuple[list, ...] = ([], [], [], [], [])  # row, token, count, frequency, presence
    stop: tuple[list, ...] = ([], [])             # row, token
    vocab = logits.shape[-1]
    for i, req in rows:
        p = req.params
        if p.repetition_penalty != 1.0:
            seen = list(set(req.all_token_ids))
            rep[0].extend([i] * len(seen))
            rep[1].extend(seen)
            rep[2].extend([p.repetition_penalty] * len(seen))
        if p.presence_penalty or p.frequency_penalty:
            counts = Counter(req.output_token_ids)
            pen[0].extend([i] * len(counts))
            pen[1].extend(counts)
            pen[2].extend(counts.values())
            pen[3].extend([p.frequency_penalty] * len(counts))
            pen[4].extend([p.presence_penalty] * len(counts))
        if stops and _suppress_eos(req):
            ids = {t for t in (*req.eos_token_ids, *p.stop_token_ids) if 0 <= t < vocab}
            stop[0].extend([i] * len(ids))
            stop[1].extend(ids)
    if not (rep[0] or pen[0] or stop[0]):
        return
    flat = send_rows(np.concatenate([np.asarray(part, dtype=np.float64) for part in (*rep, *pen, *stop)]),
                     logits.device)
    rep_r, rep_t, rep_v, pen_r, pen_t, pen_c, pen_f, pen_p, stop_r, stop_t = flat.split(
        [len(part) for part in (*rep, *pen, *stop)])
    if rep[0]:
        where = (rep_r.long(), rep_t.long())
        vals, by = logits[where], rep_v.float()
        logits[where] = torch.where(vals > 0, vals / by, vals * by).to(logits.dtype)
    if pen[0]:
        where = (pen_r.long(), pen_t.long())
        logits[where] = (logits[where] - (pen_f.float() * pen_c.float() + pen_p.float())).to(logits.dtype)
    if stop[0]:
        # (a value on the device: a Python number would be copied there by a copy that waits)
        logits.index_put_((stop_r.long(), stop_t.long()), logits.new_full((), float("-inf")))


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask tokens outside top-k, the top-p nucleus and the min-p floor with -inf (one row). Top-k
    keeps exactly k tokens: of those tied with the k-th largest logit, the lowest ids, as the
    batched path's stable sort does."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        tied = logits == kth
        keep = (logits > kth) | (tied & (tied.cumsum(0) <= top_k - (logits > kth).sum()))
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, stable=True)  # (ties by token id)
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
        own = logits.dtype != torch.float32  # (.float() copies: adjusted may change that copy)
        logits = logits.float()
        want_logprobs = any(r.params.logprobs is not None for r in requests)
        raw_logprobs = logits.log_softmax(-1) if want_logprobs else None
        if constrained_rows(requests):  # (the tokens their grammars forbid: -inf, in a copy)
            if not own:
                logits, own = logits.clone(), True
            mask_rows(logits, requests)
        if plain_greedy(requests):
            checked = logits
            tokens = self.argmax(logits).tolist()
        elif batch_device(logits):
            checked = adjusted(logits, requests, own)
            tokens = self.sample_batch(checked, requests).tolist()
        else:
            checked = adjusted(logits, requests)
            tokens = [self._sample_row(logits[i].clone(), r) for i, r in enumerate(requests)]
        bad = unusable_rows(checked).nonzero().flatten().tolist()
        for i in bad:
            tokens[i] = 0  # (a stand-in while the others' logprobs are read)
        logprobs: list[TokenLogprobs | None] = [None] * len(requests)
        if raw_logprobs is not None:
            for i, r in enumerate(requests):
                if r.params.logprobs is not None:
                    logprobs[i] = top_logprobs(raw_logprobs[i], tokens[i], r.params.logprobs)
        for i in bad:
            tokens[i], logprobs[i] = UNUSABLE_TOKEN, None
        return tokens, logprobs

    def sample_on_device(self, logits: torch.Tensor, requests: Sequence[Request],
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """The same tokens as ``__call__`` (requests without logprobs), as an int64 tensor on the
        logits' device. When every request is plain greedy, or the logits are on a device that
        samples in the batch (``batch_device``), they never leave it, and are written into ``out``
        if it is given (an int64 tensor [B] on that device); otherwise they come back in a new
        tensor."""
        if not plain_greedy(requests):
            if batch_device(logits):
                own = logits.dtype != torch.float32
                rows = logits.float()
                if constrained_rows(requests):
                    rows, own = rows.clone() if not own else rows, True
                    mask_rows(rows, requests)
                tokens = self.sample_batch(adjusted(rows, requests, own), requests)
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
        """Every row's token [B] (int64, on the logits' device), from logits already ``adjusted``
        for penalties and a held-back EOS: greedy rows their argmax; sampled rows a draw from
        softmax(logits / T) after top-k, top-p (over the top-k's renormalised mass) and min-p
        (``distributions``), by the inverse CDF in vocabulary order of one uniform number from the
        request's generator (greedy rows draw none), as ``draw``: a row's token depends on its own
        parameters and number only, not on what it is batched with."""
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
        _adjust(row[None], [(0, req)])  # (a view: in place)
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
    # (a row without mass, NaN, finds no entry: it takes the last, a valid id; see unusable_rows)
    return _search(probs.cumsum(-1, dtype=torch.float64), uniforms[:, None])[:, 0].clamp_(max=probs.shape[-1] - 1)


def unusable_rows(logits: torch.Tensor) -> torch.Tensor:
    """Which rows of logits [B, V] no token can be sampled from: a NaN, a +inf (softmax gives NaN)
    or no entry above -inf. bool [B], on the logits' device (one reduction; nothing waits)."""
    return ~torch.isfinite(logits.amax(-1))


def mark_unusable(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``tokens`` [B] with ``UNUSABLE_TOKEN`` where ``unusable_rows(logits)``: a copy for the host
    (the tokens themselves, valid ids, may feed the next step on the device)."""
    return torch.where(unusable_rows(logits), UNUSABLE_TOKEN, tokens)


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
    """Whether this request's row is sampled from the logits as they come: no penalties, no EOS
    held back (otherwise ``adjusted`` changes a copy first)."""
    return not req.params.needs_penalties and not _suppress_eos(req)


def plain_greedy(requests: Sequence[Request]) -> bool:
    """Every row's token is its argmax: greedy, no penalties, no EOS held back (Request.plain_from),
    no grammar."""
    return all(r.greedy and len(r.all_token_ids) >= r.plain_from and r.grammar is None for r in requests)


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
