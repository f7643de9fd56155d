"""Penalties and held-back stop tokens: their definitions, and rows with them sampled in the batch
(``sampler.adjusted``) against the one-row path's distribution after the same changes."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from deepinfer.core import sampling_filters as filters
from deepinfer.core.request import Request
from deepinfer.core.sampler import Sampler, apply_penalties, filter_logits
from deepinfer.core.sampling_params import SamplingParams


def test_penalties_follow_their_definitions():
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    req = Request("r", [1], params)
    req.all_token_ids += [2, 2, 3]
    req.num_pending = 1  # (a token a step in flight samples: no token yet, the last logit stays)
    logits = torch.tensor([1.0, 2.0, -2.0, 4.0, 1.0])
    out = apply_penalties(logits.clone(), req)
    expected = torch.tensor([1.0, 1.0, -4.0 - 0.5 - 0.5, 2.0 - 0.5 - 0.25, 1.0])
    assert torch.allclose(out, expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_penalised_and_eos_held_rows_are_sampled_in_the_batch(device, monkeypatch):
    """Rows with penalties or a held-back EOS are sampled with the others: each row's token is the
    draw, by its request's first uniform number, from the one-row path's distribution of its
    logits after its penalties (by their definitions) and with its stop tokens masked; greedy ones
    their argmax after the same. The caller's logits are left as they were, the tokens stay on the
    device (in ``out`` when given) and, on a GPU, nothing waits for the device (so such steps can
    overlap the next one's planning); on the CPU the rows with top-k or top-p go through the
    batched filters (``filters.nucleus_rows`` counts them), top-k's among 64 candidates."""
    vocab = 512
    logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(5)) * 2
    kinds = [  # sampling parameters, output tokens so far
        ({"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.3}, [3, 7, 7]),
        ({"temperature": 1.1, "top_k": 6, "presence_penalty": 0.5, "frequency_penalty": 0.4}, [7, 9, 9, 9]),
        ({"temperature": 1.0, "min_tokens": 4, "stop_token_ids": [11]}, [5]),  # EOS (2) and 11 held back
        ({"temperature": 0, "repetition_penalty": 2.0}, [int(logits[3].argmax())]),  # its argmax penalised
        ({"temperature": 0.7, "top_p": 0.8}, [1]),  # neither: beside the others
        ({"temperature": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 0.8}, [4, 6]),
        ({"temperature": 1.0, "presence_penalty": -1.5}, [8]),
    ]
    requests = []
    for i, (kw, out) in enumerate(kinds):
        req = Request(f"r{i}", [1, 2], SamplingParams(seed=40 + i, **kw), eos_token_ids=frozenset({2}))
        req.all_token_ids += out
        requests.append(req)
    want = []
    for i, (_, out) in enumerate(kinds):
        p = requests[i].params
        row = logits[i].clone()
        seen = sorted({1, 2, *out})
        row[seen] = torch.where(row[seen] > 0, row[seen] / p.repetition_penalty, row[seen] * p.repetition_penalty)
        counts = torch.bincount(torch.tensor(out), minlength=vocab).float()
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        if requests[i].num_output_tokens < p.min_tokens:
            row[[2, *p.stop_token_ids]] = float("-inf")
        if p.greedy:
            want.append(int(row.argmax()))
            continue
        dist = filter_logits(row / p.temperature, p.effective_top_k, p.top_p, p.min_p).softmax(-1).double()
        u = float(torch.rand(1, generator=torch.Generator().manual_seed(p.seed), dtype=torch.float64))
        want.append(int((dist.cumsum(0) <= u * dist.sum()).sum()))
    assert want[3] != int(logits[3].argmax())  # (the penalty changed the greedy row's token)
    monkeypatch.setattr(filters, "nucleus_rows", Counter())
    dev_logits = logits.to(device)
    assert Sampler()(dev_logits, requests)[0] == want
    for i, req in enumerate(requests):  # the same draws again, from fresh generators
        req.generator = torch.Generator().manual_seed(40 + i)
    buf = torch.zeros(len(requests), dtype=torch.long, device=device)
    sampler = Sampler()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # (a copy or read that waits for the GPU raises)
    try:
        assert sampler.sample_on_device(dev_logits, requests, out=buf) is buf
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert buf.cpu().tolist() == want
    assert torch.equal(dev_logits.cpu(), logits)
    if device == "cpu":  # rows 0, 1, 4 and 5 filter, in both calls; top-k's rows (1 and 5) among 64
        assert sum(filters.nucleus_rows.values()) == 8 and filters.nucleus_rows[64] >= 4
