"""deepspark's rule without a model: the acceptance table, the round depth from measured costs,
proposals that verify everything (the rates that decide rounds that draft nothing:
test_deepspark_rates.py)."""
from __future__ import annotations

import pytest

from deepinfer_builtin.drafters.deepspark.drafter import AcceptanceTable
from deepinfer_builtin.drafters.deepspark.lookup import LookupDrafts


def test_deepspark_table_learns_and_budget_keeps_prefixes():
    table = AcceptanceTable(buckets=4, positions=3, prior_strength=2.0)
    assert table.estimate(table.bucket(0.9), 0) == pytest.approx(0.875)
    for _ in range(50):
        table.record(3, 0, False)
    assert table.estimate(3, 0) < 0.1
    from deepinfer_builtin.drafters.deepspark.drafter import DeepSparkDrafter

    drafter = DeepSparkDrafter.__new__(DeepSparkDrafter)
    drafter.table = table
    buckets, chain = drafter.value_chain([0.1, 0.9, 0.9])
    assert buckets == [0, 3, 3] and chain == sorted(chain, reverse=True)


def _timed_deepspark(step_seconds: float, rest_seconds: float, tick: float | None = None):
    """A deepspark drafter (no model) that has measured these round costs, whose clock advances
    ``tick`` (default: step_seconds) between calls, and whose table has learnt that 60% of drafts
    at each position are accepted."""
    import itertools

    from deepinfer_builtin.drafters.deepspark.drafter import DeepSparkDrafter, DeepSparkOptions, RoundCosts, RoundRates
    from deepinfer_builtin.drafters.deepspark.round_rates import RequestAlone

    d = DeepSparkDrafter.__new__(DeepSparkDrafter)
    # (rounds skipped only in graphs, which these drafters are not in unless a test says so)
    d.options = DeepSparkOptions(buckets=1, prior_strength=1.0, min_value=0.25, skip_when_slower="graphs")
    d.rates, d._round, d.in_graphs = RoundRates(d.options.explore_every), None, False
    d._last_kind, d._last_ids, d._after_plain, d._plan, d._chained_plan = None, set(), False, None, None
    d._closed, d._gained, d._known_end = False, {}, set()
    d.alone, d._running = RequestAlone(d.options.skip_margin), 0
    d.table = AcceptanceTable(1, 5, 1.0)
    for pos in range(5):
        for i in range(999):
            d.table.record(0, pos, i % 5 < 3)
    d.costs = RoundCosts(names=("rest", "first", "step"))
    d.free_verification, d.lookup = False, False
    d.lookups = LookupDrafts(AcceptanceTable(3, 5, 1.0, 0.9), 5, 4, 2)
    d.costs.rest, d.costs.first, d.costs.step = rest_seconds, step_seconds, step_seconds
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
    # the costs are learnt from the clock: a draft step timed at 3 ms moves a 1 ms average by 20%;
    # a round's first draft step (which also feeds the round's new tokens) has an average of its own
    learning = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010, tick=0.003)
    learning.another_step(1, [conf[0]], [0])
    assert (learning.costs.first, learning.costs.step) == (pytest.approx(0.0014), 0.001)
    # the first draft step of a round after plain steps feeds the draft the tokens it missed: not
    # timed; the next one is, as a later step
    learning._after_plain = True
    learning.another_step(1, [conf[0]], [0])
    assert (learning.costs.first, learning.costs.step) == (pytest.approx(0.0014), 0.001)
    learning.another_step(2, [conf[1]], [0])
    assert (learning.costs.first, learning.costs.step) == (pytest.approx(0.0014), pytest.approx(0.0014))
    assert learning.costs.rest == 0.010


@pytest.mark.parametrize("margin, goes_on", [(0.0, False), (0.05, False), (0.15, True), (0.3, True)])
def test_deepspark_round_depth_leans_deeper_by_its_margin(margin, goes_on):
    """After 1 draft E = 1.6 in T = 3 ms + 1 ms: 0.4 tokens a ms so far. Another step adds
    G = 0.36 in 1 ms: 10% slower, so it goes on only with a margin of more than 10%."""
    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.003, tick=0.0)
    d.options = d.options.model_copy(update={"depth_margin": margin})
    d.free_verification = True
    d._after_plain = True  # (the costs stay as set)
    assert d.another_step(1, [[0.5]], [0]) == goes_on


def test_deepspark_round_depth_prices_the_next_step_at_a_later_steps_cost():
    """The first draft step counts in the round's time, but another step costs what a later one
    does (until one is measured, what the first does). With P_j = 0.6^j over the threshold (free
    verification), after 1 draft E = 1.6, and another step adds G = 0.36: with the first step at
    3 ms, later ones at 1 ms and C0 = 4 ms, 0.36 / 1 ms > 1.6 / 7 ms goes on, where pricing the
    next step as the first (0.36 / 3 ms < 1.6 / 7 ms) would stop."""
    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.004, tick=0.0)
    d.free_verification = True
    d.costs.first = 0.003
    d._after_plain = True  # (so that these calls leave the first step's average as set)
    assert d.another_step(1, [[0.5]], [0])
    d.costs.step = None  # no later step measured yet: priced as the first
    assert not d.another_step(1, [[0.5]], [0])
    assert (d.costs.rest, d.costs.first) == (0.004, 0.003)
    # a later steps' average above the first's (from a time of costly steps, which rounds that stop
    # at one step would never renew) is capped by the first's: first 1 ms, T = 5 ms, 0.36 / 1 ms >
    # 1.6 / 5 ms goes on, where the stale 5 ms (0.36 / 5 ms) would stop
    d.costs.first, d.costs.step = 0.001, 0.005
    assert d.another_step(1, [[0.5]], [0])


def test_deepspark_verifying_everything_skips_the_chains_and_learns_the_same():
    """Where every P_j passes (verification free in graphs, no budget), proposals verify all
    drafts and record the same buckets as the general rule would (here run through a budget
    larger than the drafts)."""
    from types import SimpleNamespace

    from deepinfer_builtin.drafters.draft_model.runner import Draft

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
    # buckets of confidences 0.95, 0.4, 0.05 and 0.15, 0.75 (prior: 4 trials); a's third draft,
    # after its second was rejected, was never put to the test and is not recorded
    assert got[0] == got[1] == ({"a": ([5, 6, 7], 3), "b": ([8, 9], 2)},
                                [(1, 0, 5.0, 1.6), (4, 1, 5.0, 1.8), (7, 1, 5.0, 3.0), (9, 0, 5.0, 4.8)])


def test_deepspark_learns_from_a_sample_of_a_large_rounds_requests_in_turn():
    """With ``learn_per_round`` 4, rounds of 10 requests learn from every third one reported,
    starting one further each round: over three rounds, each request's verification once."""
    from collections import Counter
    from types import SimpleNamespace

    from deepinfer_builtin.drafters.draft_model.runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.options = d.options.model_copy(update={"learn_per_round": 4})
    d.free_verification, d._ended, d._buckets, d.k = True, None, {}, 5
    reqs = [SimpleNamespace(request_id=str(i)) for i in range(10)]
    drafts = {r.request_id: Draft([1, 2], None, [0.5, 0.5]) for r in reqs}
    d.runner = SimpleNamespace(loop=object(), propose=lambda requests, k, *a, whole_rounds, lazy: dict(drafts))
    learnt, per_round = Counter(), []
    for _ in range(3):
        props, before = d.propose(reqs), d.table.trials[0][0]
        for r in reqs:
            trials = d.table.trials[0][0]
            d.observe(r, props[r.request_id].num_verify, 1)
            learnt[r.request_id] += d.table.trials[0][0] - trials
        per_round.append(d.table.trials[0][0] - before)
        assert d._buckets == {}  # every request's drafts let go, learnt from or not
    assert dict(learnt) == dict.fromkeys(drafts, 1) and sorted(per_round) == [3, 3, 4]


def test_deepspark_without_cost_awareness_always_goes_on():
    d = _timed_deepspark(step_seconds=0.005, rest_seconds=0.002)
    d.options = d.options.model_copy(update={"cost_aware": False})
    assert d.another_step(1, [[0.5]], [0])


def test_deepspark_lookup_replaces_the_draft_model_where_it_pays_better():
    """A request whose context repeats its last tokens gets the lookup's continuation (the draft
    model is not asked for it), verified while its learnt P_j passes the threshold. Observations
    land in the lookup's table, by match length (up to the first rejected draft), and the model's
    rounds move its average gain. In a batch where some request has no lookup the model runs, and
    a lookup is taken only if it gains at least what the model's drafts do; in a round where every
    request has one, lookups are taken while their rounds are measured to give tokens faster."""
    from types import SimpleNamespace

    from deepinfer_builtin.drafters.deepspark.drafter import _Lookup
    from deepinfer_builtin.drafters.draft_model.runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.options = d.options.model_copy(update={"cost_aware": False, "lookup_max_batch": 64})  # (2 requests here)
    d.k, d._buckets, d._ended, d.lookup = 5, {}, None, True
    now = [0.0]
    d.clock = lambda: now[0]
    lk = d.lookups
    asked = []
    d.runner = SimpleNamespace(propose=lambda requests, *a, **kw: asked.extend(r.request_id for r in requests)
                               or {r.request_id: Draft([7, 7], None, [0.9, 0.9]) for r in requests},
                               release=lambda rid: None)
    repeats = SimpleNamespace(request_id="a", all_token_ids=[1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4])  # 4-gram
    fresh = SimpleNamespace(request_id="b", all_token_ids=[10, 11, 12, 13])

    def round_(requests, seconds):
        asked.clear()
        props = d.propose(requests)
        now[0] += seconds
        return props

    props = round_([repeats, fresh], 1.0)
    assert asked == ["b"] and props["b"].tokens == [7, 7]
    # the prior: 0.9 a position, so P_j = 0.9 ** j, a gain of 3.7 over the model's 1.0; all five
    # pass the threshold (0.25)
    assert props["a"].tokens == [5, 6, 9, 9, 1] and props["a"].num_verify == 5
    assert isinstance(d._buckets["a"], _Lookup) and d._buckets["a"].bucket == 2
    d.observe(repeats, 5, 1)  # the first accepted, the second not (the rest were not put to the test)
    assert lk.table.trials[2] == [2.0, 2.0, 1.0, 1.0, 1.0]
    assert lk.table.accepted[2][:2] == pytest.approx([1.9, 0.9])
    d.observe(fresh, 2, 2)
    assert lk.model_gain == pytest.approx(1.05)
    for _ in range(12):  # 4-grams fail at their second draft: worth less than the model's drafts
        round_([repeats, fresh], 1.0)
        d.observe(repeats, 5, 1)
    props = round_([repeats, fresh], 1.0)
    assert asked == ["a", "b"] and not isinstance(d._buckets["a"], _Lookup)
    assert (lk.seconds.lookup, lk.seconds.model) == (None, 1.0)
    # alone, its lookups make a round of their own: the model does not run (first to time them) ...
    props = round_([repeats], 0.25)
    assert asked == [] and props["a"].num_verify == 1
    round_([repeats], 1.0)
    assert lk.seconds.lookup == 0.25
    # ... and while lookup rounds (1 + their gain g in their seconds) beat the model's (1 + its
    # gain in 1 s), though g is below the model's gain
    assert asked == [] and lk.seconds.model == 1.0
    g = lk._candidate(repeats, lk._chains(d.verify_threshold))[2]
    assert g < lk.model_gain
    even = (1 + g) / (1 + lk.model_gain)  # the lookup rounds' seconds at which both pay alike
    for seconds, model_runs in ((0.99 * even, False), (1.01 * even, True)):
        lk.seconds.lookup, lk.seconds.model = seconds, 1.0
        lk._last = None  # (no round under way to time)
        round_([repeats], 0.0)
        assert asked == (["a"] if model_runs else [])
    # released, its index goes
    d.release(repeats)
    assert "a" not in lk.indexes
