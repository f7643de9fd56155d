"""Speculative decoding is lossless: same greedy tokens, target distribution preserved, pool exact."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.core.request import Request
from deepinfer.core.spec import verify
from deepinfer_builtin.deepspark import AcceptanceTable
from deepinfer_builtin.ngram import ngram_continuation
from tests.tiny_models import hybrid, make_model

DRAFTERS = ["ngram", "draft-model", "deepspark"]
DEMO_PROMPTS = ["import os\n", "def read_config(path):\n", "class Stack:\n    def __init__(self):\n",
                "import sys\nimport re\n\n"]


def _assert_pools_free(llm: LLM) -> None:
    llm.engine.kv.pool.check_all_free()
    runner = getattr(llm.engine.drafter, "runner", None)
    if runner is not None:
        runner.pool.check_all_free()
        assert not runner.seqs


@pytest.fixture(scope="module")
def demo_reference():
    base = LLM(progress=False, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    return [o.outputs[0].token_ids for o in base.generate(DEMO_PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_outputs_identical_on_the_demo_pair(drafter, demo_reference):
    llm = LLM(progress=False, dtype="float32", plugins=[drafter])
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)]
    assert got == demo_reference
    m = llm.get_metrics()
    assert m["deepinfer:spec_decode_num_drafts"] > 0 and m["deepinfer:spec_decode_num_accepted_tokens"] > 0
    assert m["deepinfer:spec_decode_num_accepted_tokens"] <= m["deepinfer:spec_decode_num_verified_tokens"]
    assert m["deepinfer:spec_decode_num_verified_tokens"] <= m["deepinfer:spec_decode_num_draft_tokens"]
    _assert_pools_free(llm)


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    draft = tmp_path_factory.mktemp("draft")
    make_model(target, "qwen3", **hybrid(12))
    make_model(draft, "llama", seed=1, num_hidden_layers=1)
    return str(target), str(draft)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_mixed_batch_with_preemption_is_lossless(drafter, random_pair):
    target, draft = random_pair
    prompts = [[7 + i, 8, 9, 10, 11] * (1 + i % 3) for i in range(8)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    penalised = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3)
    params = [greedy if i % 3 else penalised for i in range(8)]  # penalised requests do not speculate
    ref = [o.outputs[0].token_ids for o in LLM(target, dtype="float32", block_size=4, progress=False)
           .generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    opts = {} if drafter == "ngram" else {drafter: {"model": draft}}
    llm = LLM(target, dtype="float32", block_size=4, num_kv_blocks=24, max_model_len=64, plugins=[drafter],
              plugin_options=opts, progress=False)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]
    assert got == ref
    assert llm.get_metrics()["deepinfer:num_preemptions"] > 0
    _assert_pools_free(llm)


def test_drafts_left_on_the_device_are_verified_as_their_values(random_pair):
    """A proposal whose tokens are placeholders for a device tensor (``DeviceTokens``) verifies as
    the same proposal with the values would: ngram's drafts, handed over that way in an eager
    engine with preemption, give the reference's greedy tokens and the same acceptance; the values
    are read only after the verification step."""
    from deepinfer.plugins import DeviceTokens, DraftProposal

    target, _ = random_pair
    prompts = [{"prompt_token_ids": [7 + i, 8, 9, 10, 11] * (2 + i % 3)} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    runs, fetched = {}, []
    for on_device in (False, True):
        llm = LLM(target, dtype="float32", block_size=4, num_kv_blocks=24, max_model_len=64, plugins=["ngram"],
                  progress=False)
        if on_device:
            drafter, propose = llm.engine.drafter, llm.engine.drafter.propose

            def handed_over(requests, propose=propose):
                plain = propose(requests)
                values = [t for p in plain.values() for t in p.tokens]
                source = DeviceTokens(torch.tensor(values), lambda v=values: fetched.append(len(v)) or v)
                out, row = {}, 0
                for rid, p in plain.items():
                    out[rid] = DraftProposal([-(row + j + 1) for j in range(len(p.tokens))], source=source)
                    row += len(p.tokens)
                return out

            drafter.propose = handed_over
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        m = llm.get_metrics()
        runs[on_device] = got, m["deepinfer:spec_decode_num_accepted_tokens"], m["deepinfer:num_preemptions"]
        _assert_pools_free(llm)
    ref = [o.outputs[0].token_ids for o in LLM(target, dtype="float32", block_size=4, progress=False)
           .generate(prompts, params, use_tqdm=False)]
    assert runs[True] == runs[False] and runs[True][0] == ref
    assert runs[True][1] > 0 and runs[True][2] > 0  # drafts accepted, requests preempted
    assert fetched  # the values were read (after each verification), not the placeholders verified


def test_seeded_sampling_with_a_drafter_is_reproducible_and_batch_independent(random_pair):
    target, draft = random_pair
    llm = LLM(target, dtype="float32", plugins=["draft-model"], plugin_options={"draft-model": {"model": draft}},
              progress=False)
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=16, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": [5, 6, 7]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    batch = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 9]}], [seeded, other],
                         use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone
    _assert_pools_free(llm)


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_rejection_sampler_output_follows_the_target_distribution(deterministic_draft):
    """Chi-square test of the first emitted token against p, for fixed p and q on 6 tokens."""
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    q = torch.tensor([0.40, 0.05, 0.20, 0.05, 0.10, 0.20])
    logits = p.log().expand(2, 6).clone()  # temperature 1: the target distribution is exactly p
    req = Request("r", [1], SamplingParams(temperature=1.0, seed=123))
    gen = torch.Generator().manual_seed(0)
    draw = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    n = 20000
    for _ in range(n):
        if deterministic_draft:
            d, qq = 0, None  # always proposes token 0 (one-hot q)
        else:
            d = int(torch.multinomial(q, 1, generator=draw))
            qq = q[None]
        counts[verify(logits, req, [d], qq, gen)[0]] += 1
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001


def test_greedy_verification_accepts_the_matching_prefix_then_corrects():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 7, 1]):
        logits[row, best] = 5.0
    req = Request("g", [1], SamplingParams(temperature=0))
    assert verify(logits, req, [3, 4, 2], None, torch.Generator()) == [3, 4, 7]
    assert verify(logits, req, [3, 4, 7], None, torch.Generator()) == [3, 4, 7, 1]  # bonus token


def test_ngram_finds_the_latest_longest_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    assert ngram_continuation(toks, 3, 2, 2) == [8, 5]
    assert ngram_continuation([4, 5, 6], 3, 2, 2) == []


def test_deepspark_table_learns_and_budget_keeps_prefixes():
    table = AcceptanceTable(buckets=4, positions=3, prior_strength=2.0)
    assert table.estimate(table.bucket(0.9), 0) == pytest.approx(0.875)
    for _ in range(50):
        table.record(3, 0, False)
    assert table.estimate(3, 0) < 0.1
    from deepinfer_builtin.deepspark import DeepSparkDrafter

    drafter = DeepSparkDrafter.__new__(DeepSparkDrafter)
    drafter.table = table
    buckets, chain = drafter.value_chain([0.1, 0.9, 0.9])
    assert buckets == [0, 3, 3] and chain == sorted(chain, reverse=True)


def _timed_deepspark(step_seconds: float, rest_seconds: float, tick: float | None = None):
    """A deepspark drafter (no model) that has measured these round costs, whose clock advances
    ``tick`` (default: step_seconds) between calls, and whose table has learnt that 60% of drafts
    at each position are accepted."""
    import itertools

    from deepinfer_builtin.deepspark import DeepSparkDrafter, DeepSparkOptions, RoundCosts, RoundRates

    d = DeepSparkDrafter.__new__(DeepSparkDrafter)
    d.options = DeepSparkOptions(buckets=1, prior_strength=1.0)
    d.rates, d._round, d.in_graphs = RoundRates(d.options.explore_every), None, False
    d._last_kind, d._last_ids, d._after_plain = None, set(), False
    d.table = AcceptanceTable(1, 5, 1.0)
    for pos in range(5):
        for i in range(999):
            d.table.record(0, pos, i % 5 < 3)
    d.costs = RoundCosts()
    d.free_verification = False
    d.costs.rest, d.costs.step = rest_seconds, step_seconds
    tick = step_seconds if tick is None else tick
    d.clock, d._mark = itertools.count(100.0, tick).__next__, 100.0 - tick
    return d


@pytest.mark.parametrize("batch", [1, 64])
def test_deepspark_round_depth_follows_the_measured_costs(batch):
    """With the acceptance at 0.6 per draft, P_j = 0.6^j: after j drafts a request expects
    1 + 0.6 + ... + 0.6^j tokens (those >= min_value 0.25: j <= 2) and one more step adds 0.6^(j+1)
    if that is >= 0.25. Cheap draft steps: draft while P stays over min_value; expensive ones:
    stop after the first."""
    conf = [[0.5] * j for j in range(1, 5)]
    cheap = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    # after 1 draft: E = 1.6 a request, T = 11 ms; G = 0.36 a request in 1 ms: 0.36 > 1.6 / 11
    assert cheap.another_step(1, [conf[0]] * batch, list(range(batch)))
    # after 2: the third draft's P = 0.216 < min_value would not be verified: no gain
    assert not cheap.another_step(2, [conf[1]] * batch, list(range(batch)))
    costly = _timed_deepspark(step_seconds=0.005, rest_seconds=0.002)
    # after 1 draft: T = 7 ms; G / t = 0.36 / 5 ms < E / T = 1.6 / 7 ms
    assert not costly.another_step(1, [conf[0]] * batch, list(range(batch)))
    # only the requests still drafting add to the gain: one of 64 does not pay for a step
    if batch > 1:
        assert not cheap.another_step(1, [conf[0]] * batch, [0])
    # verified in graphs (free): the third draft counts too; E = 1.96 in T = 12 ms, G = 0.216 in 1 ms
    cheap.free_verification = True
    assert cheap.verify_threshold == 0.0
    assert cheap.another_step(2, [conf[1]] * batch, list(range(batch)))
    # the costs are learnt from the clock: a draft step timed at 3 ms moves a 1 ms average by 20%
    # (the first draft step of a round too: a round that stops there still measures one)
    learning = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010, tick=0.003)
    learning.another_step(1, [conf[0]], [0])
    assert learning.costs.step == pytest.approx(0.0014)
    # the first draft step of a round after plain steps feeds the draft the tokens it missed: not
    # timed; the next one is
    learning._after_plain = True
    learning.another_step(1, [conf[0]], [0])
    assert learning.costs.step == pytest.approx(0.0014)
    learning.another_step(2, [conf[1]], [0])
    assert learning.costs.step == pytest.approx(0.00172)
    assert learning.costs.rest == 0.010


def test_deepspark_verifying_everything_skips_the_chains_and_learns_the_same():
    """Where every P_j passes (verification free in graphs, no budget), proposals verify all
    drafts and record the same buckets as the general rule would (here run through a budget
    larger than the drafts)."""
    from types import SimpleNamespace

    from deepinfer_builtin.draft_runner import Draft

    drafts = {"a": Draft([5, 6, 7], None, [0.95, 0.4, 0.05]), "b": Draft([8, 9], None, [0.15, 0.75])}
    got = []
    for budget in (0, 1000):
        d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
        d.options = d.options.model_copy(update={"buckets": 10, "verify_budget": budget})
        d.table = AcceptanceTable(10, 5, 4.0)
        d.free_verification, d._ended, d._buckets, d.k = True, None, {}, 5
        d.runner = SimpleNamespace(loop=object(), propose=lambda requests, k, *a, whole_rounds, lazy: dict(drafts))
        props = d.propose([SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")])
        for rid in props:  # each verified all its drafts; its first was accepted
            d.observe(SimpleNamespace(request_id=rid), props[rid].num_verify, 1)
        learnt = [(b, pos, d.table.trials[b][pos], d.table.accepted[b][pos]) for b in range(10) for pos in range(5)
                  if d.table.trials[b][pos] != 4.0]
        got.append(({rid: (p.tokens, p.num_verify) for rid, p in props.items()}, learnt))
    # buckets of confidences 0.95, 0.4, 0.05 and 0.15, 0.75 (prior: 4 trials)
    assert got[0] == got[1] == ({"a": ([5, 6, 7], 3), "b": ([8, 9], 2)},
                                [(0, 2, 5.0, 0.2), (1, 0, 5.0, 1.6), (4, 1, 5.0, 1.8), (7, 1, 5.0, 3.0),
                                 (9, 0, 5.0, 4.8)])


T, F = True, False


@pytest.mark.parametrize("spec_faster", [False, True])
def test_round_rates_run_the_faster_kind_and_look_at_the_other_ever_less_often(spec_faster):
    """Each kind runs four rounds at a time, measured from the second (the first speculative round
    after plain steps also catches the draft up); after measuring both, the faster runs, with looks
    at the other after gap - 4 rounds of it, the gap doubling from explore_every with each look
    that finds the same kind faster, and starting over when the other turns out faster. Batch
    sizes of one power-of-two class share their measurements."""
    from deepinfer_builtin.deepspark import RoundRates

    r = RoundRates(explore_every=6)
    kinds, samples, bests = [], [], []

    def rounds(n, spec_tokens, spec_seconds=3.0):
        for i in range(n):
            spec, sample = r.speculate(5 + i % 4)  # 5..8: one size class
            kinds.append(spec)
            samples.append(sample)
            bests.append(r._best.get(8))
            if sample:  # speculative: spec_seconds for spec_tokens; plain: 1 s for 8 tokens
                r.record(spec, 8, spec_seconds if spec else 1.0, spec_tokens if spec else 8)

    rounds(24, 32 if spec_faster else 16)
    fast, slow = (T, F) if spec_faster else (F, T)
    # four of each kind, then the faster (the initial rounds count towards its run), looks of four
    # at the other after 2, 8, 20 ... rounds of it
    if spec_faster:
        assert kinds == [T] * 4 + [F] * 4 + [T] * 2 + [F] * 4 + [T] * 8 + [F] * 2
    else:
        assert kinds == [T] * 4 + [F] * 4 + [T] * 4 + [F] * 8 + [T] * 4
    look = 10 if spec_faster else 8
    assert samples[:8] == [F, T, T, T] * 2 and samples[look:look + 4] == [F, T, T, T]
    # (seconds a token a request: 3 s for 4 or 2 tokens a request; plain: 1 s for 1)
    assert r._best[8] == (fast, 24) and r.seconds == {(T, 8): 0.75 if spec_faster else 1.5, (F, 8): 1.0}
    # the slower kind turns faster: a few looks later it runs, and its gap starts over
    rounds(200, 8 if spec_faster else 64, 2.9)
    assert r._best[8][0] == slow and kinds[-40:].count(slow) >= 30
    flip = next(i for i, b in enumerate(bests) if b is not None and b[0] == slow)
    assert bests[flip - 1][1] >= 24 and bests[flip][1] in (6, 12)  # (12: a look at once)
    assert r.speculate(9) == (T, F)  # another size class starts measuring
    # the rate is the rounds' seconds over their tokens: rounds of 1 token in 1 s and of 3 in 1 s
    # give 2 tokens a second (each round's own rate averaged would say 2/3 s a token) ...
    w = RoundRates(4, window=5)
    w.record(T, 1, 1.0, 1)
    w.record(T, 1, 1.0, 3)
    assert w.seconds[(T, 1)] == 1.0 / 2.0
    # ... of the last `window` rounds, the slowest quarter left out (warm-up, an idle engine)
    w.record(T, 1, 50.0, 1)
    assert w.seconds[(T, 1)] == 1.0 / 2.0
    for _ in range(4):
        w.record(T, 1, 2.0, 2)
    assert w.seconds[(T, 1)] == 1.0  # (1.0, 1) and (1.0, 3) out of the window; (50.0, 1) and one (2.0, 2) cut
    # a kind within the margin (5%) of the faster one does not take over; past it, it does
    h = RoundRates(16)
    for spec, sec in [(T, 1.0)] * 4 + [(F, 0.97)] * 4:
        h.speculate(1)
        h.record(spec, 1, sec, 1)
    assert h.speculate(1) == (F, T)  # plain faster
    even = RoundRates(16)  # speculating as fast as plain steps (within 5%) is not enough to start with
    for spec in [T] * 4 + [F] * 4:
        even.speculate(1)
        even.record(spec, 1, 0.97 if spec else 1.0, 1)
    assert even.speculate(1)[0] == F
    for sec, speculates in ((1.03, F), (1.10, T)):
        for _ in range(12):
            h.record(F, 1, sec, 1)
        assert h.speculate(1)[0] == speculates  # speculating 3% faster: plain stays; 9%: it goes


def test_deepspark_drafts_nothing_while_plain_steps_are_faster():
    """Timed by its clock, deepspark's speculative rounds (3 s for 2 tokens) lose to plain steps
    (1 s a token): after measuring both it proposes nothing, but for a look at speculating now and
    then. A round is a sample only if its step computed just its own tokens and no request joined
    after it; one that a request left still is."""
    from types import SimpleNamespace

    from deepinfer_builtin.deepspark import RoundRates
    from deepinfer_builtin.draft_runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.rates, d._ended, d._buckets, d.k = RoundRates(6), None, {}, 5  # (looks of 4 rounds)
    d.options = d.options.model_copy(update={"skip_min_batch": 1})
    assert d.options.skip_when_slower == "graphs" and not d.may_skip(1)
    d.in_graphs = True  # as if the engine verified in device graphs
    assert d.may_skip(1)
    d.runner = SimpleNamespace(propose=lambda requests, k, *a, whole_rounds, lazy: {"a": Draft([5], None, [0.9])})
    now = [0.0]
    d.clock = lambda: now[0]
    req, other = SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")

    def step(requests, prompt_tokens=0):  # an engine step: propose, verify, end
        props = d.propose(requests)
        if props:
            d.observe(req, 1, 1)  # its draft accepted: 2 tokens this round
        d.deepinfer_step_end(num_tokens=len(requests) + sum(len(p.verified) for p in props.values()) + prompt_tokens)
        now[0] += 3.0 if props else 1.0
        return bool(props)

    drafted = [step([req]) for _ in range(14)]
    assert drafted == [T, T, T, T, F, F, F, F, T, T, T, T, F, F]
    assert d.rates.seconds == {(T, 1): 1.5, (F, 1): 1.0}
    plain = len(d.rates.rounds[(F, 1)])
    # a step that also computed another request's prompt is no sample (the last round, closed
    # here, is)
    step([req], prompt_tokens=30)
    step([req])
    assert len(d.rates.rounds[(F, 1)]) == plain + 1
    step([req])
    assert len(d.rates.rounds[(F, 1)]) == plain + 2
    # nor is a round after which a request joined, or the joining round: two rounds of the pair,
    # the second a sample (3 tokens, 1.5 a request, in 3 s), closed by a round of one of them
    # (a request that left is no reason to drop it)
    step([req, other])
    assert len(d.rates.rounds[(F, 1)]) == plain + 2
    step([req, other])
    assert (T, 2) not in d.rates.rounds
    step([req])
    assert list(d.rates.rounds[(T, 2)]) == [(3.0, 1.5)]
    # a round that a request starts (the draft computes its prompt in it) is no sample either
    counts = {key: len(v) for key, v in d.rates.rounds.items()}
    for _ in range(2):
        step([SimpleNamespace(request_id="c")])
    assert {key: len(v) for key, v in d.rates.rounds.items()} == counts


def test_deepspark_mixing_plain_and_speculative_rounds_is_lossless(demo_reference):
    """Skipping in eager steps too, with explore_every 2, deepspark alternates plain steps and
    speculative rounds whatever the timings: the greedy output stays the target's, every pool is
    free after."""
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"],
              plugin_options={"deepspark": {"explore_every": 2, "skip_when_slower": "always", "skip_min_batch": 1}})
    rates, kinds = llm.engine.drafter.rates, []
    speculate = rates.speculate

    def recording(batch):
        choice = speculate(batch)
        kinds.append(choice[0])
        return choice

    rates.speculate = recording
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)] == demo_reference
    assert T in kinds and F in kinds
    _assert_pools_free(llm)


def test_deepspark_without_cost_awareness_always_goes_on():
    d = _timed_deepspark(step_seconds=0.005, rest_seconds=0.002)
    d.options = d.options.model_copy(update={"cost_aware": False})
    assert d.another_step(1, [[0.5]], [0])


def test_deepspark_stops_drafting_what_it_would_not_verify(demo_reference):
    """Early stop spares the draft steps of drafts below min_value and changes nothing else: the
    same greedy tokens, the same drafts verified and accepted. (With sampling, fewer draft
    samples leave the draft's generator elsewhere, so sampled drafts differ; outputs stay samples
    of the target's distribution, which test_rejection_sampler_... checks.)"""
    runs = {}
    prompts = DEMO_PROMPTS
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for early in (True, False):
        llm = LLM(progress=False, dtype="float32", plugins=["deepspark"],
                  plugin_options={"deepspark": {"early_stop": early, "min_value": 0.4, "cost_aware": False,
                                                "skip_when_slower": "never"}})
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        runs[early] = outs, llm.get_metrics()
        _assert_pools_free(llm)
    (early_out, early_m), (full_out, full_m) = runs[True], runs[False]
    assert early_out == full_out == demo_reference
    for key in ("num_drafts", "num_verified_tokens", "num_accepted_tokens"):
        assert early_m[f"deepinfer:spec_decode_{key}"] == full_m[f"deepinfer:spec_decode_{key}"], key
    assert full_m["deepinfer:spec_decode_num_draft_tokens"] == 5 * full_m["deepinfer:spec_decode_num_drafts"]
    assert early_m["deepinfer:spec_decode_num_draft_tokens"] < full_m["deepinfer:spec_decode_num_draft_tokens"]


def test_drafts_with_the_prefix_cache_stay_lossless(demo_reference):
    """Rejected drafts' KV must never reach a cached block: repeat the prompts to hit the cache."""
    llm = LLM(progress=False, dtype="float32", plugins=["prefix-cache", "deepspark"], block_size=4)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for _ in range(2):
        got = [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)]
        assert got == demo_reference
    # the continuations themselves are cached now: a prompt extended by its own output hits them
    longer = [{"prompt_token_ids": o.prompt_token_ids + o.outputs[0].token_ids[:40]}
              for o in llm.generate(DEMO_PROMPTS[:1], params, use_tqdm=False)]
    out = llm.generate(longer, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == demo_reference[0][40:48]
    assert out.num_cached_tokens >= 32
    llm.engine.kv.pool.check_all_free()
    llm.engine.drafter.runner.pool.check_all_free()
