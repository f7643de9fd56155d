"""deepspark in device graphs, without a model: the lookups' requests join the loop graph's mixed
rounds, and where rounds chain behind verifications, only rounds that draft are chained."""
from __future__ import annotations

import pytest

from tests.plugins.test_deepspark_rule import _timed_deepspark


@pytest.mark.parametrize("loop_takes", [True, False])
def test_deepspark_in_graphs_feeds_the_lookups_requests_to_the_loop_graph(loop_takes):
    """In graphs, where the loop graph drafts a round that mixes lookups and the model's drafts,
    the requests that take lookups join it (it computes their new tokens, so that their draft
    never falls a streak of lookups behind); their proposals stay the lookup's, and what is learnt
    from them goes to the lookup's table. Where the loop would not take the round, they stay out."""
    from types import SimpleNamespace

    from deepinfer_builtin.drafters.deepspark.drafter import _Lookup
    from deepinfer_builtin.drafters.draft_model.runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.k, d._buckets, d._ended, d.lookup, d.in_graphs = 5, {}, None, True, True
    d.free_verification = True  # (verification in graphs: every draft verified)
    d.options = d.options.model_copy(update={"device_drafts": False, "lookup_max_batch": 64})
    asked, sizes = [], []

    def loop_size(num_seqs, longest, k, requests=None):
        sizes.append((num_seqs, longest, k))
        return 8 if loop_takes else None

    d.runner = SimpleNamespace(propose=lambda requests, *a, **kw: asked.extend(r.request_id for r in requests)
                               or {r.request_id: Draft([7, 7, 7, 7, 7], None, [0.9] * 5) for r in requests},
                               loop_size=loop_size, release=lambda rid: None)
    greedy = SimpleNamespace(greedy=True)
    repeats = SimpleNamespace(request_id="a", all_token_ids=[1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4], params=greedy)
    fresh = SimpleNamespace(request_id="b", all_token_ids=[10, 11, 12, 13], params=greedy)
    props = d.propose([repeats, fresh])
    assert sizes == [(2, 12, 5)]
    assert asked == (["a", "b"] if loop_takes else ["b"])
    assert props["a"].tokens == [5, 6, 9, 9, 1] and props["b"].tokens == [7] * 5
    assert isinstance(d._buckets["a"], _Lookup) and isinstance(d._buckets["b"], Draft)
    trials = list(d.lookups.table.trials[2])
    d.observe(repeats, 5, 2)
    assert [t - t0 for t, t0 in zip(d.lookups.table.trials[2], trials, strict=True)] == [1, 1, 1, 0, 0]


def test_deepspark_chains_a_round_only_where_it_is_to_draft():
    """Where rounds chain behind verifications (on_verified), a batch that may draft nothing has its
    next round's kind chosen there: a plain round chains nothing (its chained round would go
    unused), and the proposal after it follows that choice. Batches under skip_min_batch always chain."""
    from types import SimpleNamespace

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.k, d.in_graphs = 5, True  # (in graphs, batches of skip_min_batch (here 8) or more may skip)
    d.options = d.options.model_copy(update={"skip_min_batch": 8})
    chained = []
    d.runner = SimpleNamespace(chain=lambda verified, *args: chained.append(len(verified)))
    greedy = SimpleNamespace(greedy=True)
    reqs = [SimpleNamespace(request_id=str(i), all_token_ids=[1, 2, 3], params=greedy) for i in range(8)]
    verified = [(r, [-(i * 5 + j + 1) for j in range(5)], 6 * i) for i, r in enumerate(reqs)]
    for speculate in (False, True):
        d._choose = lambda requests, ids=None, s=speculate: (s, True)
        d.on_verified(verified, None, None)
        assert chained == ([8] if speculate else [])
        assert d._chained_plan == (speculate, True, d.rates.size_class(8), {r.request_id for r in reqs})
        if not speculate:
            d._choose = lambda requests, ids=None: pytest.fail("the proposal must take the plan made with the verification")
            assert d.propose(reqs) == {} and d._chained_plan is None  # a plain round, as planned
    # a plan is for its requests only: a proposal with another one chooses anew
    other = SimpleNamespace(request_id="new", all_token_ids=[1, 2], params=greedy)
    chosen = []
    d._choose = lambda requests, ids=None: chosen.append(len(requests)) or (False, False)
    d.propose(reqs[1:] + [other])
    assert chosen == [8] and d._chained_plan is None
    d._choose = lambda requests, ids=None: pytest.fail("a batch that cannot skip has no kind to choose")
    d._chained_plan = (False, False, 0, {"0"})
    d.on_verified(verified[:1], None, None)
    assert chained == [8, 1] and d._chained_plan is None  # (and no plan left from before)
