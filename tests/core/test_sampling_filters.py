"""The batched path's filters (deepinfer/core/sampling_filters.py) against a definition over a whole
stable sort of each row."""
from __future__ import annotations

import torch

from deepinfer.core import sampling_filters as filters
from deepinfer.core.request import Request
from deepinfer.core.sampling_filters import filtered_weights, needs_sort, sampling_rows, send_rows
from deepinfer.core.sampling_params import SamplingParams


def _sorted_reference(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """filtered_weights' definition for rows with top-k or top-p, one row at a time: the softmax in
    vocabulary order; the tokens in a stable descending sort of the logits; kept while among the
    top k, while the float64 sum of the probabilities before them is under top_p times the top k's
    sum (1 without top-k), and while at least min_p of the largest; then back in vocabulary order."""
    vocab = logits.shape[-1]
    out = []
    for row, p in zip(logits, params, strict=True):
        x = row.float() / torch.tensor(p.temperature, dtype=torch.float64).float()
        probs = x.softmax(-1)
        order = x.sort(descending=True, stable=True).indices
        sp = probs[order]
        mass = sp.cumsum(-1, dtype=torch.float64)
        k = p.effective_top_k or vocab
        in_k = mass[k - 1] if k < vocab else torch.tensor(1.0, dtype=torch.float64)
        keep = (torch.arange(vocab) < k) & ((mass - sp) < p.top_p * in_k)
        if p.min_p:
            keep &= sp >= torch.tensor(p.min_p, dtype=torch.float64).float() * sp[0]
        out.append(torch.zeros(vocab).scatter_(0, order, sp * keep))
    return torch.stack(out)


def test_cpu_rows_that_sort_find_their_tokens_among_their_largest_logits_with_a_whole_sorts_numbers(monkeypatch):
    """On the CPU a row with top-k or top-p looks for its kept tokens among its 64, 512 or 2,048
    largest logits before it sorts them all (filters.CANDIDATES): whichever way it takes, its
    weights are bit for bit those of the definition over a whole stable sort, ties at the edge of
    the candidates (bfloat16 logits, a block of equal logits, -inf) included, alone or in a batch."""
    vocab = 8192
    g = torch.Generator().manual_seed(11)
    scale = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5, 0.2, 6.0, 3.0] * 8)[:, None]
    logits = (torch.randn(64, vocab, generator=g) * scale).bfloat16().float()  # (ties, as a model's)
    logits[5, 100:400] = logits[5].max() - 0.5  # 300 equal logits just below the largest
    logits[6, :4000] = float("-inf")
    logits[7, 50:] = float("-inf")  # 50 tokens left: top-k 300 keeps them all
    # one large logit, then 396 equal ones from token 50 on, which both filters below cut inside
    logits[9:11] = -10.0
    logits[9:11, 7000], logits[9:11, 50:7970:20] = 5.0, 3.0
    logits[11] = float("-inf")  # (no token left: NaN throughout, as a whole sort gives it)
    cases = [(0.8, 0, 0.9, 0.0), (1.0, 0, 0.95, 0.0), (0.7, 40, 1.0, 0.0), (1.0, 5, 0.8, 0.0), (1.2, 300, 0.99, 0.0),
               (0.9, 0, 0.5, 0.05), (1.0, 3000, 1.0, 0.0), (1.0, 1, 1.0, 0.0), (0.6, 0, 0.999, 0.0), (1.0, 0, 0.7, 0.2)]
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in (cases * 7)[:64]]
    params[7] = SamplingParams(temperature=1.0, top_k=300, top_p=1.0)
    params[9:11] = [SamplingParams(temperature=1.0, top_p=0.05), SamplingParams(temperature=1.0, top_k=10)]
    reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(params)]
    before = filters.nucleus_rows.copy()
    host = sampling_rows(reqs, vocab)
    got = filtered_weights(logits, send_rows(host, logits.device), needs_sort(host, vocab), host)
    want = _sorted_reference(logits, params)
    assert got[11].isnan().all() and not got[torch.arange(64) != 11].isnan().any()
    assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0))
    # every way was taken: rows were done with each count of candidates, and some sorted whole
    done = filters.nucleus_rows - before
    assert filters.CANDIDATES == (64, 512, 2048) and sorted(done) == [64, 512, 2048, vocab]
    assert done.total() == 64 and min(done.values()) > 0

    def last_of_ties(x, count):  # equal values taken from the highest token ids: the least helpful choice
        values, flipped = x.flip(-1).sort(dim=-1, descending=True, stable=True)
        return values[:, :count], x.shape[-1] - 1 - flipped[:, :count]

    monkeypatch.setattr(filters, "_largest", last_of_ties)
    assert torch.equal(filtered_weights(logits, send_rows(host, logits.device), True, host).nan_to_num(-1.0),
                       want.nan_to_num(-1.0))
    kept = (got > 0).sum(-1)
    assert kept[torch.arange(64) != 11].min() >= 1 and kept.max() > 2048
    for i in (5, 6, 7, 8, 9, 10, 11, 30):
        one = sampling_rows([reqs[i]], vocab)
        alone = filtered_weights(logits[i:i + 1], send_rows(one, logits.device), True, one)[0]
        assert torch.equal(alone.nan_to_num(-1.0), got[i].nan_to_num(-1.0))
    # beside rows that do not sort, and with every filter run (no host array): the same numbers
    mixed = [SamplingParams(temperature=0.8), *params[:7], SamplingParams(temperature=1.1, min_p=0.1)]
    host = sampling_rows([Request(f"m{i}", [1], p) for i, p in enumerate(mixed)], vocab)
    dev = send_rows(host, logits.device)
    chosen = filtered_weights(logits[:9], dev, True, host)
    assert torch.equal(chosen[1:8], _sorted_reference(logits[1:8], params[:7]))
    assert torch.equal(chosen, filtered_weights(logits[:9], dev, True))
