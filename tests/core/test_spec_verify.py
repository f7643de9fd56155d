"""The rejection sampler against the target distributions it must reproduce, position by position,
for a batch of requests with different sampling parameters and draft counts verified together."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.request import Request
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.verification import verify, verify_batch
from tests.core.test_sampler import BATCH_CASES, _reference

#: the target's logits at each position (fixed, whatever came before) and the draft's distributions
TARGET = torch.tensor([[1.0, 0.6, 0.3, 0.0, -0.3, -0.6, -1.0],
                       [-0.8, 0.9, 0.0, 0.4, -0.2, 1.1, 0.2],
                       [0.3, -0.5, 1.2, 0.0, 0.7, -0.1, -0.9]])
DRAFT = torch.tensor([[0.30, 0.25, 0.15, 0.10, 0.10, 0.05, 0.05],
                      [0.05, 0.30, 0.10, 0.15, 0.05, 0.30, 0.05]])


def _chi2(counts: torch.Tensor, want: torch.Tensor) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of ``counts`` against probabilities ``want``
    (tokens of probability zero left out; bins expecting under 5 pooled into one)."""
    live = want > 0
    expected, counts = want[live].double() * counts.sum(), counts[live].double()
    small = expected < 5
    if small.any():
        expected = torch.cat((expected[~small], expected[small].sum()[None]))
        counts = torch.cat((counts[~small], counts[small].sum()[None]))
    return float(((counts - expected) ** 2 / expected).sum()), len(expected) - 1


#: chi-square at p = 0.001 by degrees of freedom
CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batched_rejection_sampling_gives_each_position_the_targets_distribution(device):
    """Every filter case, each with one-draft and two-draft requests and with drafts sampled from q
    or deterministic (q None), in one ``verify_batch``: the k-th token each request gains follows
    that case's target distribution at position k (given the tokens before it were the drafts),
    by chi-square, and tokens the target's filters drop never come out."""
    per_kind = 2500
    gen = torch.Generator().manual_seed(5)
    items, kinds, rows = [], [], []
    for c, (temp, top_k, top_p, min_p) in enumerate(BATCH_CASES):
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        for n in (1, 2):
            for deterministic in (False, True):
                drafted = torch.stack([torch.multinomial(DRAFT[j], per_kind, replacement=True, generator=gen)
                                       for j in range(n)], 1)
                if deterministic:
                    drafted = torch.tensor([[1, 5][:n]] * per_kind)  # the same proposal every time
                for i in range(per_kind):
                    req = Request(f"{c}-{n}-{deterministic}-{i}", [1], params)
                    items.append((req, drafted[i].tolist(), None if deterministic else DRAFT[:n].to(device)))
                    rows.append(TARGET[:n + 1])
                kinds += [c] * per_kind
    logits = torch.cat(rows).to(device)
    out = verify_batch(logits, items, torch.Generator().manual_seed(9))
    assert [t[:-1] for t in out] == [d[:len(t) - 1] for (_, d, _), t in zip(items, out, strict=True)]
    for c, case in enumerate(BATCH_CASES):
        gained = [t for t, k in zip(out, kinds, strict=True) if k == c]
        for pos in range(3):
            tokens = torch.tensor([t[pos] for t in gained if len(t) > pos], dtype=torch.long)
            want = _reference(TARGET[pos], case)
            counts = torch.bincount(tokens, minlength=TARGET.shape[1])
            assert counts[want == 0].sum() == 0, (case, pos, counts)
            chi2, dof = _chi2(counts, want)  # (one live token: the line above has checked it all)
            assert dof == 0 or chi2 < CRITICAL[dof], (case, pos, chi2, counts, want)


def test_verification_keeps_a_seeded_request_independent_of_its_batch():
    """A seeded request takes len(drafts) + 1 numbers from its own generator whatever happens, so
    what it gains is the same verified alone (``verify``) and among others, seeded or not."""
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(0))
    drafts_gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 40, generator=drafts_gen).softmax(-1)
    others_logits = torch.randn(8, 40, generator=drafts_gen)
    for seed in range(40):
        params = SamplingParams(temperature=0.9, top_p=0.9, seed=seed)
        drafts = torch.multinomial(q, 1, generator=drafts_gen)[:, 0].tolist()
        alone = verify(logits, Request("r", [1], params), drafts, q, torch.Generator().manual_seed(2))
        others = [(Request("a", [1], SamplingParams(temperature=1.0)), [3, 4], q[:2]),
                  (Request("b", [1], SamplingParams(temperature=0.5, seed=99)), [7, 8, 9, 1], None)]
        together = verify_batch(torch.cat((others_logits[:3], logits, others_logits[3:])),
                                [others[0], (Request("r", [1], params), drafts, q), others[1]],
                                torch.Generator().manual_seed(3))
        assert together[1] == alone, seed


def test_verify_batch_refuses_a_request_without_drafts():
    req = Request("r", [1], SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="at least one draft"):
        verify_batch(torch.zeros(1, 5), [(req, [], None)], torch.Generator())
    assert verify_batch(torch.zeros(0, 5), [], torch.Generator()) == []
