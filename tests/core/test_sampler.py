"""Sampler pieces against direct torch references."""
from __future__ import annotations

import pickle

import pytest
import torch

from deepinfer.core.request import Request
from deepinfer.core.sampler import (
    Sampler,
    filter_logits,
    sample_rows,
    top_logprobs,
    torch_argmax,
)
from deepinfer.core.sampling_filters import distributions, needs_sort, sampling_rows, send_rows
from deepinfer.core.sampling_params import SamplingParams


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.0, 0.5])
    kept = filter_logits(logits.clone(), 2, 1.0, 0.0).isfinite()
    assert kept.tolist() == [False, True, False, True, False]


def test_top_k_keeps_the_lowest_ids_of_logits_tied_with_the_kth():
    """As the batched path (a stable sort, ties by token id): exactly k tokens, whatever the ties."""
    logits = torch.tensor([1.0, 3.0, 1.0, 2.0, 1.0, 0.0])
    assert filter_logits(logits.clone(), 3, 1.0, 0.0).isfinite().tolist() == [True, True, False, True, False, False]
    assert filter_logits(logits.clone(), 4, 1.0, 0.0).isfinite().tolist() == [True, True, True, True, False, False]
    assert filter_logits(logits.clone(), 5, 1.0, 0.0).isfinite().tolist() == [True] * 5 + [False]
    flat = torch.zeros(6)
    assert filter_logits(flat, 2, 1.0, 0.0).isfinite().tolist() == [True, True] + [False] * 4
    dev = send_rows(sampling_rows([Request("r", [1], SamplingParams(temperature=1.0, top_k=3))], 6), logits.device)
    batched = distributions(logits[None], dev, True) > 0
    assert batched[0].tolist() == filter_logits(logits.clone(), 3, 1.0, 0.0).isfinite().tolist()


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = filter_logits(probs.log(), 0, 0.8, 0.0).isfinite()
    assert kept.tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = filter_logits(probs.log(), 0, 0.81, 0.0).isfinite()
    assert kept.tolist() == [True, True, True, False]


def test_min_p_drops_tokens_below_fraction_of_the_best():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    kept = filter_logits(probs.log(), 0, 1.0, 0.2).isfinite()  # floor 0.12
    assert kept.tolist() == [True, True, False, False]


def test_seeded_samples_follow_the_distribution():
    """Sampling draws from softmax(logits / T): empirical frequencies match."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    params = SamplingParams(temperature=0.7, seed=3)
    req = Request("r", [1], params)
    sampler = Sampler()
    counts = torch.zeros(4)
    n = 4000
    for _ in range(n):
        tok, _ = sampler(logits[None], [req])
        counts[tok[0]] += 1
    expected = (logits / 0.7).softmax(-1) * n
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def test_logprobs_list_sampled_token_then_top_k():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    req = Request("r", [1], SamplingParams(temperature=0, logprobs=2))
    tokens, lps = Sampler()(logits, [req])
    assert tokens == [1]
    ref = logits[0].log_softmax(-1)
    assert list(lps[0]) == [1, 3] and abs(lps[0][3] - ref[3].item()) < 1e-6
    assert lps[0].rank == 1 and lps[0].rank_of(3) == 2


def test_logprobs_rank_the_token_in_the_whole_vocabulary_and_survive_pickling():
    """vLLM's rank: the tokens of a logprob at least the token's own, for a sampled token far past
    the k listed; the k likeliest 1 to k."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    req = Request("r", [1], SamplingParams(temperature=1.0, seed=1, logprobs=2))
    ref = logits.log_softmax(-1)
    for row in range(3):
        for token in (int(ref[row].argmin()), int(ref[row].argsort()[20]), int(ref[row].argmax())):
            entry = top_logprobs(ref[row], token, 2)
            want = int((ref[row] >= ref[row, token]).sum())
            assert entry.rank == want and entry.rank_of(token) == want
            top = ref[row].topk(2).indices.tolist()
            absent = next(t for t in range(50) if t not in entry)
            assert [entry.rank_of(t) for t in top] == [1, 2] and entry.rank_of(absent) is None
            again = pickle.loads(pickle.dumps(entry))
            assert again == entry and again.rank == want and list(again) == list(entry)
    tokens, lps = Sampler()(logits, [req] * 3)
    for row, (token, entry) in enumerate(zip(tokens, lps, strict=True)):
        assert next(iter(entry)) == token and entry.rank == int((ref[row] >= ref[row, token]).sum())


def test_tied_logprobs_rank_as_vllms():
    """A tie takes the lower place for the position's own token; the k likeliest take 1 to k in
    torch.topk's order, ties or not."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    ref = logits[0].log_softmax(-1)
    entry = top_logprobs(ref, 2, 2)
    assert entry.rank == 3  # three tokens at 3.0, itself among them
    top = ref.topk(2).indices.tolist()
    assert [entry.rank_of(t) for t in top] == [1, 2] and list(entry.top) == top
    if 2 not in top:  # (listed first, outside the top two: its own rank)
        assert entry.rank_of(2) == 3
    low = top_logprobs(ref, 0, 2)
    assert low.rank == 5 and low.rank_of(0) == 5 and top_logprobs(ref, 3, 0).rank_of(3) == 4


def test_samples_on_the_device_go_into_a_given_tensor_whatever_the_argmax_takes(monkeypatch):
    from deepinfer.core import sampler as sampler_module

    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]])
    greedy = [Request(f"r{i}", [1, 2], SamplingParams(temperature=0)) for i in range(2)]
    sampled = [Request("s", [1, 2], SamplingParams(temperature=1.0, seed=3)), greedy[1]]
    penalised = [Request("p", [1, 2], SamplingParams(temperature=1.0, seed=3, repetition_penalty=1.2)), greedy[1]]
    calls = []
    for argmax in (None, lambda x: calls.append("plain") or x.argmax(-1),
                   lambda x, out=None: calls.append("out") or torch.argmax(x, -1, out=out)):
        s = Sampler()
        if argmax is not None:
            s.argmax = argmax  # a device's fused argmax, with out= or without
        buf = torch.full((4,), -5, dtype=torch.long)
        got = s.sample_on_device(logits, greedy, out=buf[:2])
        assert got.data_ptr() == buf.data_ptr() and buf.tolist() == [1, 0, -5, -5]
        assert s.sample_on_device(logits, greedy).tolist() == [1, 0]  # no out: a tensor of its own
        # sampled in the batch: there too
        both = s.sample_on_device(logits, sampled, out=buf[:2])
        assert both.data_ptr() == buf.data_ptr() and buf[1:].tolist() == [0, -5, -5] and buf[0].item() in (0, 1, 2)
        buf[:2] = torch.tensor([1, -1])
        other = s.sample_on_device(logits, penalised, out=buf[:2])  # a penalised row: in the batch too
        assert other.data_ptr() == buf.data_ptr() and buf[1:].tolist() == [0, -5, -5] and buf[0].item() in (0, 1, 2)
        buf[:2] = torch.tensor([1, 0])
        # logits on a device the batched path has not been tested on (an NPU's): rows one by one, on the host
        monkeypatch.setattr(sampler_module, "batch_device", lambda logits: False)
        rows = s.sample_on_device(logits, sampled, out=buf[:2])
        assert rows.data_ptr() != buf.data_ptr() and rows[1].item() == 0 and buf.tolist() == [1, 0, -5, -5]
        monkeypatch.undo()
    assert calls == ["plain", "plain", "out", "out"]


def test_draw_follows_its_distribution_and_never_draws_a_zero(monkeypatch):
    """The inverse-CDF draw (the samplers', the rejection sampler's, the draft's): chi-square against
    q on 6 tokens, entries of probability 0 never drawn; a draw at the very top of the range gives
    the last entry that has any probability, and a distribution with none gives its argmax."""
    from deepinfer.core import sampler

    q = torch.tensor([0.30, 0.0, 0.05, 0.25, 0.40, 0.0])
    gen = torch.Generator().manual_seed(5)
    n = 20000
    counts = torch.zeros(6)
    for _ in range(n):
        counts[sampler.draw(q, gen)] += 1
    assert counts[1] == 0 and counts[5] == 0
    live = q > 0
    expected = q[live] * n
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001
    monkeypatch.setattr(sampler.torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))
    assert sampler.draw(q, gen) == 4
    assert sampler.draw(torch.zeros(3), gen) == 0


BATCH_CASES = [  # temperature, top_k, top_p, min_p
    (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.3, 3, 1.0, 0.0), (1.0, 0, 0.6, 0.0), (1.0, 0, 1.0, 0.2),
    (0.9, 4, 0.7, 0.05), (1.0, 2, 0.5, 0.0), (1.0, 3, 0.75, 0.0),  # (the last: top-p over the top-k's mass)
]


def _reference(logits: torch.Tensor, case) -> torch.Tensor:
    """The one-row path's distribution: filter_logits after the temperature, then softmax."""
    temp, top_k, top_p, min_p = case
    return filter_logits(logits / temp, top_k, top_p, min_p).softmax(-1)



@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batched_sampling_follows_each_rows_filtered_distribution(device):
    """``sample_batch`` against the one-row path's distribution (filter_logits' top-k, then top-p
    over the kept mass, then min-p), every case in one batch: chi-square per case, filtered-out
    tokens never drawn, greedy rows their argmax; on the CPU and on a GPU (tokens left there)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    rows = 3000
    requests, cases = [], []
    for c, (temp, top_k, top_p, min_p) in enumerate(BATCH_CASES):
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        requests += [Request(f"c{c}-{i}", [1], params) for i in range(rows)]
        cases += [c] * rows
    greedy = [Request(f"g{i}", [1], SamplingParams(temperature=0)) for i in range(5)]
    batch = requests + greedy
    tokens = Sampler(seed=11).sample_batch(logits.expand(len(batch), -1).to(device), batch)
    assert tokens.dtype == torch.long and tokens.shape == (len(batch),) and tokens.device.type == device
    tokens = tokens.cpu()
    assert tokens[len(requests):].tolist() == [0] * 5
    cases_t = torch.tensor(cases)
    for c, case in enumerate(BATCH_CASES):
        want = _reference(logits, case)
        counts = torch.bincount(tokens[:len(requests)][cases_t == c], minlength=len(logits)).double()
        assert counts[want == 0].sum() == 0, (case, counts)
        live = want > 0
        expected = want[live].double() * rows
        chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
        # (degrees of freedom: live - 1, at most 6: 22.46 is p = 0.001 for 6)
        assert chi2 < 22.46, (case, chi2, counts, expected)


def test_batched_sampling_keeps_a_seeded_request_independent_of_its_batch():
    """A seeded request draws one number from its own generator a step (greedy rows draw none), so
    its tokens are the same alone and among other rows, sampled and greedy, with and without a
    penalised row beside it (whose row ``__call__`` changes in a copy of the logits first)."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))

    def run(batch_of: int, penalised: bool) -> list[int]:
        s = Sampler(seed=1)
        req = Request("r", [1], SamplingParams(temperature=0.9, top_p=0.8, seed=21))
        others = [Request(f"o{i}", [1], SamplingParams(temperature=0 if i % 2 else 1.0, top_k=5))
                  for i in range(batch_of - 1)]
        if penalised:
            others.append(Request("p", [1], SamplingParams(temperature=1.0, repetition_penalty=1.3)))
        got = []
        for step in range(6):
            rows = [req, *others]
            got.append(s(logits[step:step + 1].expand(len(rows), -1).clone(), rows)[0][0])
        return got

    alone = run(1, False)
    assert run(5, False) == alone and run(3, True) == alone


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_rows_sampled_with_their_distributions_follow_them(device):
    """``sample_rows`` (a draft model's draws, each from a uniform number of its own): the
    distributions it returns are the one-row path's, in vocabulary order, one-hot for greedy
    rows; the tokens follow them (chi-square per case) and are drawn by the given numbers."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    rows = 3000
    requests = [Request(f"c{c}-{i}", [1], SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m))
                for c, (t, k, p, m) in enumerate(BATCH_CASES) for i in range(rows)]
    requests.append(Request("g", [1], SamplingParams(temperature=0)))
    uniforms = torch.rand(len(requests), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    tokens, probs = sample_rows(logits.expand(len(requests), -1).to(device), requests, uniforms.tolist())
    assert tokens.device.type == device and probs.device.type == device
    tokens, probs = tokens.cpu(), probs.cpu()
    assert probs[-1].tolist() == [1.0] + [0.0] * 6 and tokens[-1] == 0
    for c, case in enumerate(BATCH_CASES):
        want = _reference(logits, case)
        assert torch.allclose(probs[c * rows], want, atol=1e-6), (case, probs[c * rows], want)
        counts = torch.bincount(tokens[c * rows:(c + 1) * rows], minlength=len(logits)).double()
        assert counts[want == 0].sum() == 0, (case, counts)
        live = want > 0
        expected = want[live].double() * rows
        chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
        assert chi2 < 22.46, (case, chi2, counts, expected)
    # the inverse CDF of each row's own number: the first token whose cumulative mass exceeds it
    cdf = probs[:rows].double().cumsum(-1)
    assert tokens[:rows].tolist() == [int((row <= u).sum()) for row, u in zip(cdf, uniforms[:rows], strict=True)]


def test_distributions_are_the_same_numbers_with_every_filter_run():
    """A device graph fixes its work when captured, so it runs every filter (no host array to skip
    by): for any mix of rows, the distributions are then bit for bit those of the host's choice,
    which skips the filters no row uses."""
    logits = torch.randn(8, 40, generator=torch.Generator().manual_seed(3)) * 2
    mixes = {"temperature": [(0.7, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0)],
             "min-p": [(0.7, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.3)],
             "sorted": [(0.7, 0, 1.0, 0.0), (1.3, 3, 1.0, 0.0), (1.0, 0, 0.6, 0.1)],
             "greedy": [(0.0, 0, 1.0, 0.0), (0.9, 0, 1.0, 0.0)]}
    for name, cases in mixes.items():
        reqs = [Request(f"r{i}", [1], SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m))
                for i, (t, k, p, m) in enumerate((cases * 4)[:8])]
        host = sampling_rows(reqs, 40)
        dev = send_rows(host, logits.device)
        sort = needs_sort(host, 40)
        assert sort == (name == "sorted")
        chosen, every = distributions(logits, dev, sort, host), distributions(logits, dev, sort)
        assert torch.equal(chosen, every), name
        assert torch.allclose(chosen.sum(-1), torch.ones(8)), name


def test_a_rows_distribution_and_draws_depend_on_its_own_parameters_only():
    """Rows that sort their logits (top-k, top-p) and rows that do not, batched together: each
    row's distribution is bit for bit the one it gets alone (host's choice and every filter run),
    and a seeded request samples the same tokens alone and beside rows of the other kind (one
    that does not sort used to draw in the sorted order whenever another row sorted)."""
    vocab = 40
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(5)) * 2
    kinds = [(0.8, 0, 1.0, 0.0), (1.1, 0, 1.0, 0.2), (0.9, 6, 1.0, 0.0), (0.7, 0, 0.7, 0.05),
             (1.2, 10, 0.9, 0.0), (0.0, 0, 1.0, 0.0)]
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m))
            for i, (t, k, p, m) in enumerate((kinds * 2)[:8])]
    host = sampling_rows(reqs, vocab)
    dev = send_rows(host, logits.device)
    together = distributions(logits, dev, needs_sort(host, vocab), host)
    assert torch.equal(together, distributions(logits, dev, True))
    for i, r in enumerate(reqs):
        one = sampling_rows([r], vocab)
        alone = distributions(logits[i:i + 1], send_rows(one, logits.device), needs_sort(one, vocab), one)
        assert torch.equal(alone[0], together[i]), (i, r.params)

    def tokens(params: SamplingParams, beside: list[SamplingParams]) -> list[int]:
        s = Sampler(seed=1)
        rows = [Request("r", [1], params), *(Request(f"o{i}", [1], b) for i, b in enumerate(beside))]
        got = []
        for step in range(40):
            step_logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(100 + step)).expand(len(rows), -1)
            got.append(int(s.sample_batch(step_logits.contiguous(), rows)[0]))
        return got

    plain, nucleus = SamplingParams(temperature=0.9, seed=7), SamplingParams(temperature=0.9, top_p=0.8, seed=7)
    assert tokens(plain, [SamplingParams(temperature=1.0, top_p=0.5)]) == tokens(plain, [])
    assert tokens(nucleus, [SamplingParams(temperature=1.0), SamplingParams(temperature=0)]) == tokens(nucleus, [])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_the_argmax_is_torchs_first_of_tied_maxima_nan_and_infinities_included(dtype):
    """The CPU's argmax (through torch.max) against torch.argmax: ties (the first wins), NaN (the
    first NaN wins), rows of -inf, +inf; into ``out`` too."""
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        rows, vocab = 1 + trial % 7 * 9, 1 + (trial * 997) % 5000
        x = torch.randint(-3, 3, (rows, vocab), generator=g).to(dtype)  # many ties
        if trial % 3 == 0:
            x[torch.rand(rows, vocab, generator=g) < 0.01] = float("nan")
        if trial % 4 == 0:
            x[0] = float("-inf")
        if trial % 5 == 0:
            x[:, -1] = float("inf")
        want = x.argmax(-1)
        assert torch.equal(torch_argmax(x), want)
        out = torch.full((rows,), -1, dtype=torch.long)
        assert torch_argmax(x, out=out) is out and torch.equal(out, want)
