"""deepspark's choice of plain rounds where no request waits: the time until the batch is done
(RoundRates.drain), each request's rounds still needed (rounds_left), and the engine telling the
drafter whether requests wait."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.plugins import DraftProposal
from deepinfer_builtin.drafters.deepspark.round_rates import RoundRates, rounds_left


def test_drain_prices_each_round_at_the_requests_still_running():
    r = RoundRates(16)
    for _ in range(3):  # speculative rounds: 2 s at 3-4 requests, 1 s at 2; plain steps 0.5 s at 3-4
        r.record(True, 4, 2.0, 8)
        r.record(True, 2, 1.0, 4)
        r.record(False, 4, 0.5, 4)
    # rounds still needed 1, 3, 3, 5: one round at 4 requests and two at 3 (class 4: 2 s each),
    # two at 1 request (class 1 unmeasured: the nearest larger class, 2: 1 s each)
    assert r.drain(True, [3, 1, 5, 3]) == pytest.approx(1 * 2.0 + 2 * 2.0 + 2 * 1.0)
    assert r.drain(False, [3, 1, 5, 3]) == pytest.approx(5 * 0.5)  # (every class priced as 4's)
    assert RoundRates(16).drain(True, [1.0]) is None  # a kind without samples prices nothing
    # a round's seconds: the mean of the kept rounds (the slowest quarter left out, as for the rate)
    r.record(True, 4, 10.0, 8)
    assert r.round_seconds(True, 4) == pytest.approx(2.0)
    assert r.round_seconds(True, 8) == pytest.approx(2.0) and r.round_seconds(True, 1) == pytest.approx(1.0)
    assert r.round_seconds(False, 2) == pytest.approx(0.5)


def test_rounds_left_from_max_tokens_or_the_context_and_each_requests_own_gain():
    def req(rid, max_tokens, max_model_len, generated=10):
        return SimpleNamespace(request_id=rid, params=SimpleNamespace(max_tokens=max_tokens),
                               max_model_len=max_model_len, prompt_token_ids=[1, 2, 3],
                               all_token_ids=[1, 2, 3] + [7] * generated, num_output_tokens=generated)

    requests = [req("a", 50, 1000), req("b", None, 100), req("c", 500, 100)]
    spec, plain = rounds_left(requests, {"a": [30, 10], "b": [6, 2]}, gain=2.0)
    assert plain == [40, 87, 87]
    # a: 30 tokens in 10 rounds, with the batch's 2.0 a round as a prior worth 4 rounds; b: 6 in
    # 2; c: the prior alone
    assert spec == pytest.approx([40 * 14 / 38, 87 * 6 / 14, 87 / 2.0])
    # under 4 speculative rounds a request on average, the spread is not known yet
    assert rounds_left(requests, {"a": [30, 10], "b": [6, 1]}, gain=2.0) is None


@pytest.mark.parametrize("uneven", [False, True])
def test_a_batch_that_nothing_joins_speculates_only_if_it_is_done_sooner(uneven):
    """Per round, speculating is 33% faster here (2 s for 3 tokens a request against 1 s for 1).
    With one request gaining 1.5 tokens a round against the others' 4, a batch that nothing joins
    would still wait for it after the others are done: 7.5 rounds at 4 requests (2 s) and 12.5 at
    one (priced as class 4's) take 40 s against 30 plain steps' 30 s. Where requests may join,
    the rates decide. The drains set a factor on speculation's rate that holds for 8 rounds;
    plain steps chosen for such a batch run to its end."""
    def measured():
        r = RoundRates(16)
        for _ in range(4):
            r.record(True, 4, 2.0, 12)
            r.record(False, 4, 1.0, 4)
        return r

    calls = []

    def closed(gain):
        calls.append(gain)
        return ([7.5, 7.5, 7.5, 20.0] if uneven else [10.0] * 4), [30.0] * 4

    assert measured().speculate(4)[0] is True  # requests may join: the rates decide
    r = measured()
    first = [r.speculate(4, closed)[0] for _ in range(8)]
    assert first == [not uneven] * 8 and calls == [pytest.approx(3.0)]
    r.speculate(4, closed)
    if uneven:
        # plain steps, once chosen, run to the batch's end, also at size classes not measured (2,
        # where a first choice would otherwise measure speculating): no looks, no more drains
        assert len(calls) == 1 and r._closed[4][0] == pytest.approx(40 / 20)
        assert [r.speculate(4 - i // 50, closed)[0] for i in range(100)] == [False] * 100 and len(calls) == 1
        assert r.speculate(2, closed)[0] is False and 2 not in r._closed
        # requests wait: the rates decide at once (speculating, 33% faster a token)
        assert r.speculate(4)[0] is True
        # a request that joins a batch that chose plain steps brings back the choice, with the
        # drains taken anew (here a look at speculating, after so long a run of plain steps)
        assert [r.speculate(4, closed)[0] for _ in range(20)] == [False] * 20 and r.plain_to_end
        calls.clear()
        run = r._runs[4][1]
        assert r.speculate(4, closed, True)[0] is True and len(calls) == 1 and not r.plain_to_end
        # the look's gap: at least twice the run of plain steps it ends (held ones included), so
        # that after a batch held to its end the next look waits at least as long again
        assert run == 20 and r._best[4] == (False, 40)
        assert [r.speculate(4, closed)[0] for _ in range(3)] == [True] * 3  # (the rest of the look)
        assert [r.speculate(4, closed)[0] for _ in range(201)] == [False] * 201 and r.plain_to_end
        assert r.speculate(4, closed, True)[0] is True and r._best[4] == (False, 402)  # (doubling: 80)
        assert [r.speculate(4, closed)[0] for _ in range(3)] == [True] * 3
        assert [r.speculate(4, closed)[0] for _ in range(301)] == [False] * 301
        assert r.speculate(4, closed, True)[0] is False  # a new batch 301 rounds on: no look yet
        assert [r.speculate(4, closed)[0] for _ in range(96)] == [False] * 96
        assert r.speculate(4, closed, True)[0] is True and r._best[4] == (False, 804)  # 398 on: a look
    else:
        assert len(calls) == 2  # taken anew after drain_every rounds
        r.speculate(4)  # requests wait: the rates alone, and the factor is dropped
        r.speculate(4, closed)
        assert len(calls) == 3
    # while too little is known of a new batch's requests, the last factor holds (1.0 at first)
    held = measured()
    held._closed[4] = [1.7, 0]
    held.speculate(4, lambda gain: None)
    assert held._closed[4][0] == 1.7
    fresh = measured()
    fresh.speculate(4, lambda gain: None)
    assert fresh._closed[4][0] == 1.0


def test_deepspark_passes_whether_the_batch_is_closed_and_whether_a_request_joined():
    """The drains only where no request waits and every request has max_tokens (its end); a
    request whose drafts all fall below min_value still counts a speculative round of one token."""
    from deepinfer_builtin.drafters.draft_model.runner import Draft
    from tests.plugins.test_deepspark_rule import _timed_deepspark

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.options = d.options.model_copy(update={"skip_when_slower": "always", "skip_min_batch": 1})
    seen = []
    d.rates.speculate = lambda batch, closed=None, joined=False: seen.append((batch, closed, joined)) or (F, T)
    params = SimpleNamespace(max_tokens=20)
    reqs = [SimpleNamespace(request_id=str(i), params=params, max_model_len=100, prompt_token_ids=[1],
                            all_token_ids=[1, 2], num_output_tokens=1) for i in range(3)]
    d._choose(reqs)
    assert seen[-1] == (3, None, False)  # (requests wait)
    d._closed, d._last_ids = True, {"0", "1"}
    d._choose(reqs)
    assert seen[-1][1] is not None and seen[-1][2] is True  # "2" joined
    d._last_ids = {"0", "1", "2", "x"}
    d._choose(reqs)
    assert seen[-1][2] is False
    d._gained = {"0": [8, 4], "1": [4, 4], "2": [12, 4]}
    spec, plain = seen[-1][1](2.0)
    assert plain == [19, 19, 19] and spec == pytest.approx([19 * 8 / 16, 19 * 8 / 12, 19 * 8 / 20])
    # requests found with max_tokens are not looked at again; a newcomer is
    reads = []

    class Counted:
        @property
        def max_tokens(self):
            reads.append(1)  # (None: no max_tokens)
    unknown = SimpleNamespace(request_id="3", params=Counted(), max_model_len=100, all_token_ids=[1, 2])
    d._choose(reqs[1:])
    assert seen[-1][1] is not None and not reads
    d._choose(reqs + [unknown])
    assert seen[-1][1] is None and reads == [1]  # without max_tokens: no known end, the rates decide
    # requests scanned on their own (a verification's, on_verified) vouch for no other: one that
    # was in the last round but not among them is looked at, even with plain steps held
    d._known_end, d._last_ids, d.rates.plain_to_end = {"0", "1"}, {"0", "1", "3"}, True
    d._choose(reqs[:2] + [unknown])
    assert seen[-1][1] is None and reads == [1, 1]
    d._buckets, d.runner = {}, SimpleNamespace(release=lambda rid: None)
    d.release(unknown)  # (a request id let go may come back with other parameters)
    assert "3" not in d._known_end
    # below skip_min_batch RoundRates sees no round (a request could join unseen): a batch's held
    # plain steps end there
    d.rates.plain_to_end = True
    d.options = d.options.model_copy(update={"skip_min_batch": 4})
    assert d._choose(reqs) == (T, F) and not d.rates.plain_to_end and len(seen) == 6  # (rates not asked)
    # an unverified request's round (min_value above every P_j): one token, one round
    d.options = d.options.model_copy(update={"min_value": 0.9, "skip_min_batch": 8})
    d.runner = SimpleNamespace(propose=lambda requests, k, *a, whole_rounds, lazy: {"a": Draft([5], None, [0.5])})
    d._gained, d._buckets, d._ended, d.k = {}, {}, None, 5
    # (proposed with none to verify: counted as proposed, the step a plain one)
    assert d.propose([SimpleNamespace(request_id="a")]) == {"a": DraftProposal([5], None, 0)}
    assert d._gained == {"a": [1, 1]}


T, F = True, False


@pytest.mark.slow
def test_deepspark_compares_drains_only_when_no_request_waits(demo_reference_two):
    """Four prompts, two running at a time: while two wait, the rates decide; once none waits,
    the drains. The greedy tokens stay the target's, and every request's record is released."""
    prompts, reference = demo_reference_two
    # (warmup_tokens 0: these requests make 12 tokens, all within a request's first, and the drains
    # compare only once speculation is measured)
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"], max_num_seqs=2,
              plugin_options={"deepspark": {"skip_min_batch": 1, "explore_every": 2, "warmup_tokens": 0}})
    d, seen = llm.engine.drafter, []
    speculate = d.rates.speculate

    def recording(batch, closed=None, joined=False):
        seen.append((closed is not None, llm.engine.scheduler.num_waiting))
        return speculate(batch, closed, joined)

    d.rates.speculate = recording
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == reference
    assert (True, 0) in seen and any(not closed and waiting for closed, waiting in seen)
    assert all(waiting == 0 for closed, waiting in seen if closed)
    assert d._gained == {}
    llm.engine.kv.pool.check_all_free()
    d.runner.draft.pool.check_all_free()


@pytest.fixture(scope="module")
def demo_reference_two():
    prompts = ["import os\n", "def read_config(path):\n", "class Stack:\n", "for i in range(10):\n"]
    base = LLM(progress=False, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return prompts, [o.outputs[0].token_ids for o in base.generate(prompts, params, use_tqdm=False)]


@pytest.mark.slow
def test_plain_steps_held_to_a_batchs_end_let_the_engine_skip_proposals():
    """Once deepspark holds plain steps to a closed batch's end, the engine asks for no proposal
    (Rests.rests_above) until a request is added or fewer than skip_min_batch are left; then
    it asks again at once. The greedy tokens stay the target's and every block comes back."""
    prompts = [[10 + (7 * i + 3 * j) % 400 for j in range(5 + i)] for i in range(5)]
    lengths = [6, 10, 14, 26, 8]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    base = LLM(progress=False, dtype="float32")
    reference = [o.outputs[0].token_ids for o in base.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"],
              plugin_options={"deepspark": {"skip_min_batch": 3}})
    eng, d = llm.engine, llm.engine.drafter

    def held(batch, closed=None, joined=False):  # plain steps, held wherever the batch is closed
        d.rates.plain_to_end = closed is not None and not joined
        return False, False
    d.rates.speculate = held
    propose, asked = d.propose, []
    d.propose = lambda requests: asked.append(len(requests)) or propose(requests)
    for i in range(4):
        eng.add_request(str(i), prompts[i], params[i])
    steps, tokens = [], {}
    while eng.has_unfinished_requests():
        if len(steps) == 8:  # a request joins: the engine asks again
            eng.add_request("4", prompts[4], params[4])
        before, running = len(asked), len(eng.table.owner)
        for out in eng.step():
            tokens[out.request_id] = out.outputs[0].token_ids
        steps.append((running, len(asked) > before))
    assert [tokens[str(i)] for i in range(5)] == reference
    skipped = [i for i, (_, was_asked) in enumerate(steps) if not was_asked]
    assert len(skipped) >= 4 and all(steps[i][0] >= 3 for i in skipped)
    assert steps[8][1] and steps[9][1]  # (the joined request waited, then computed its prompt)
    assert all(was_asked for running, was_asked in steps if running < 3)
    # below skip_min_batch deepspark drafts again
    assert llm.get_metrics()["deepinfer:spec_decode_num_drafts"] > 0
    eng.kv.pool.check_all_free()
    d.runner.draft.pool.check_all_free()
