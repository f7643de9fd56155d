"""deepspark's rounds that draft nothing: RoundRates (which kind runs, its looks at the other, the
rates), and the drafter's choice of what is a sample."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.plugins.test_deepspark_rule import _timed_deepspark

T, F = True, False


@pytest.mark.parametrize("spec_faster", [False, True])
def test_round_rates_run_the_faster_kind_and_look_at_the_other_ever_less_often(spec_faster):
    """Each kind runs four rounds at a time, measured from the second (the first speculative round
    after plain steps also catches the draft up); after measuring both, the faster runs, with looks
    at the other after gap - 4 rounds of it, the gap doubling from explore_every with each look
    that finds the same kind faster, and starting over when the other turns out faster. Batch
    sizes of one power-of-two class share their measurements."""
    from deepinfer_builtin.drafters.deepspark.drafter import RoundRates

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
    # speculating must be measured the margin (15%) faster than plain steps to start or to take
    # over; plain steps take over from it as soon as they are measured faster at all
    h = RoundRates(16)
    for spec, sec in [(T, 1.0)] * 4 + [(F, 0.99)] * 4:
        h.speculate(1)
        h.record(spec, 1, sec, 1)
    assert h.speculate(1) == (F, T)  # plain 1% faster
    even = RoundRates(16)  # speculating 10% faster is not enough to start with
    for spec in [T] * 4 + [F] * 4:
        even.speculate(1)
        even.record(spec, 1, 0.90 if spec else 1.0, 1)
    assert even.speculate(1)[0] == F
    for sec, speculates in ((1.10, F), (1.25, T)):
        for _ in range(12):
            h.record(F, 1, sec, 1)
        assert h.speculate(1)[0] == speculates  # speculating 9% faster: plain stays; 20%: it goes
    for _ in range(12):
        h.record(F, 1, 0.98, 1)
    assert h.speculate(1)[0] == F  # plain steps 2% faster: back at once
    assert RoundRates(16, margin=0.05).margin == 0.05 and h.margin == 0.15


def test_deepspark_drafts_nothing_while_plain_steps_are_faster():
    """Timed by its clock, deepspark's speculative rounds (3 s for 2 tokens) lose to plain steps
    (1 s a token): after measuring both it proposes nothing, but for a look at speculating now and
    then. A round is a sample only if its step computed just its own tokens and no request joined
    after it; one that a request left still is."""
    from deepinfer_builtin.drafters.deepspark.drafter import RoundRates
    from deepinfer_builtin.drafters.draft_model.runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.rates, d._ended, d._buckets, d.k = RoundRates(6), None, {}, 5  # (looks of 4 rounds)
    from deepinfer_builtin.drafters.deepspark.drafter import DeepSparkOptions

    # by default, batches of at least 8 may skip, in eager steps too; in device graphs every batch
    d.options = DeepSparkOptions()
    assert d.options.skip_when_slower == "always" and d.may_skip(8) and not d.may_skip(7)
    d.in_graphs = True
    assert d.may_skip(1) and d.rests_above() in (None, 1)
    d.options = DeepSparkOptions(skip_min_batch=4)  # (set, it holds in graphs too)
    assert d.may_skip(4) and not d.may_skip(3)
    d.in_graphs = False
    d.options = DeepSparkOptions(buckets=1, prior_strength=1.0, min_value=0.25, skip_min_batch=1,
                                 skip_when_slower="graphs")
    assert not d.may_skip(1)
    d.in_graphs = True  # as if the engine verified in device graphs
    assert d.may_skip(1)
    d.runner = SimpleNamespace(propose=lambda requests, k, *a, whole_rounds, lazy: {"a": Draft([5], None, [0.9])})
    now = [0.0]
    d.clock = lambda: now[0]
    # (past their first warmup_tokens: every speculative round may be a sample)
    req, other = SimpleNamespace(request_id="a", num_output_tokens=50), SimpleNamespace(request_id="b", num_output_tokens=50)

    def step(requests, prompt_tokens=0):  # an engine step: propose, verify, end
        props = d.propose(requests)
        if props:
            d.observe(req, 1, 1)  # its draft accepted: 2 tokens this round
        d.deepinfer_step_end(engine=None, num_tokens=len(requests) + sum(len(p.verified) for p in props.values()) + prompt_tokens)
        now[0] += 3.0 if props else 1.0
        return bool(props)

    drafted = [step([req]) for _ in range(14)]
    assert drafted == [T, T, T, T, F, F, F, F, T, T, T, T, F, F]
    assert d.rates.seconds == {(T, 1): 1.5, (F, 1): 1.0}
    # asked first (the engine may leave its last step running), it chooses the round it then runs:
    # one choice a round
    calls, speculate = [], d.rates.speculate
    d.rates.speculate = lambda batch, *rest: calls.append(batch) or speculate(batch, *rest)
    assert d.needs_tokens([req]) is False and step([req]) is False and calls == [1]
    d.rates.speculate = speculate
    # a plain round followed by a speculative one is no sample (the engine waits for the step left
    # running before that proposal)
    pending = d._round
    assert pending is not None and not pending.speculative
    d.rates.speculate = lambda batch, *rest: (True, False)
    assert d.needs_tokens([req]) is True and d._round is None
    d.rates.speculate, d._round, d._plan = speculate, pending, None
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
        step([SimpleNamespace(request_id="c", num_output_tokens=50)])
    assert {key: len(v) for key, v in d.rates.rounds.items()} == counts


def test_round_rates_lengthen_a_look_by_its_unsampled_rounds():
    """A round of a look (or of a kind's first measurement) that the caller leaves unmeasured makes
    the look a round longer, at most 2 * look rounds more, after which its rounds are samples;
    rounds chosen by comparing may go unmeasured and are not lengthened."""
    from deepinfer_builtin.drafters.deepspark.round_rates import RoundRates

    def run(n, unsampled_spec, r=None):
        r = r or RoundRates(explore_every=6)  # (looks of 4)
        kinds = []
        for _ in range(n):
            spec, sample = r.speculate(1)
            kinds.append(spec)
            # (a sample unless the caller leaves it unmeasured and RoundRates lets it)
            if sample and not (spec and unsampled_spec(kinds) and r.unsampled(1)):
                # speculative: 3 s for 2 tokens; plain: 1 s a token (the faster)
                r.record(spec, 1, 3.0 if spec else 1.0, 2 if spec else 1)
        return r, kinds

    # speculation's first measurement: rounds 2-6 no samples (a request's first tokens), so it
    # runs 5 rounds longer and still gets its 3 samples
    r, kinds = run(12, lambda kinds: len(kinds) <= 6)
    assert kinds[:10] == [T] * 9 + [F] and list(r.rounds[(T, 1)]) == [(3.0, 2.0)] * 3
    # a look at speculating whose rounds are never samples: 4 rounds, then 8 more at most, after
    # which its last 3 rounds count
    r, kinds = run(8 + 14, lambda kinds: len(kinds) > 8)
    assert kinds == [T] * 4 + [F] * 4 + [T] * 12 + [F] * 2 and len(r.rounds[(T, 1)]) == 3 + 3
    # so does a first measurement that is never a sample: it does not run on for ever
    r, kinds = run(16, lambda kinds: True)
    assert kinds[:13] == [T] * 12 + [F] and len(r.rounds[(T, 1)]) == 3
    # (the same look with samples: 4 rounds, as before)
    _, kinds = run(8 + 6, lambda kinds: False)
    assert kinds == [T] * 4 + [F] * 4 + [T] * 4 + [F] * 2
    # a round chosen by comparing (speculation measured faster) is not lengthened by unsampled
    fast = RoundRates(explore_every=64)
    for spec in [T] * 4 + [F] * 4:
        fast.speculate(1)
        fast.record(spec, 1, 1.0 if spec else 2.0, 1)
    assert fast.speculate(1) == (T, F)
    assert fast.unsampled(1) and fast._plan[1] == [] and fast.speculate(1) == (T, T)


@pytest.mark.parametrize("warmup,asked_first", [(12, False), (12, True), (0, False)])
def test_deepspark_measures_no_speculation_at_a_requests_start(warmup, asked_first):
    """At batch 1 in device graphs, a request's rounds within its first warmup_tokens generated
    tokens are no samples of speculation: its first measurement runs on until the request is past
    them (2 tokens a speculative round: rounds 2-6 of a request that starts with one token), then
    takes its samples. The same where each round's kind is chosen before its proposal (the
    engine asks needs_tokens first, to keep plain rounds overlapped)."""
    from deepinfer_builtin.drafters.deepspark.drafter import DeepSparkOptions, RoundRates
    from deepinfer_builtin.drafters.draft_model.runner import Draft

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.options = DeepSparkOptions(buckets=1, prior_strength=1.0, min_value=0.25, warmup_tokens=warmup)
    d.rates, d._ended, d._buckets, d.k, d.in_graphs = RoundRates(6), None, {}, 5, True
    assert d.skip_min_batch == 1 and d.options.warmup_tokens == warmup
    d.runner = SimpleNamespace(propose=lambda requests, k, *a, whole_rounds, lazy: {"a": Draft([5], None, [0.9])})
    now = [0.0]
    d.clock = lambda: now[0]
    req = SimpleNamespace(request_id="a", num_output_tokens=1)  # (its first token from the prompt's step)
    drafted = []
    for _ in range(10):
        if asked_first:
            d.needs_tokens([req])
        props = d.propose([req])
        if props:
            d.observe(req, 1, 1)  # its draft accepted: 2 tokens this round
        d.deepinfer_step_end(engine=None, num_tokens=1 + sum(len(p.verified) for p in props.values()))
        now[0] += 3.0 if props else 1.0
        req.num_output_tokens += 2 if props else 1
        drafted.append(bool(props))
    if warmup:  # rounds 2-6 (tokens 3 to 11) unsampled, 7-9 samples
        assert drafted == [T] * 9 + [F]
    else:  # (then plain rounds, and a look at speculating)
        assert drafted == [T] * 4 + [F] * 4 + [T] * 2
    assert list(d.rates.rounds[(T, 1)]) == [(3.0, 2.0)] * 3


@pytest.mark.parametrize("spec_seconds", [0.5, 2.0, 0.9])
def test_a_request_alone_keeps_one_kind_to_its_end_and_is_timed_whole(spec_seconds):
    """A request alone (the only one running, none waiting) keeps the kind chosen at its first round
    to its end (plain steps held: the engine rests) and asks the per-round rates nothing; finished,
    it is a sample of the whole-request rates: its seconds over the tokens it generated since. Each
    kind is measured first (speculating, then plain), then the faster runs (speculating only if
    faster by the margin), with a request of the slower after 7, then 15, then 31 of the faster in
    a row. No sample: a request another joined, one aborted or preempted, one that generated fewer
    than 16 tokens, and one that was in the last round beside others (past its first rounds)."""
    from deepinfer.plugins import RequestStatus

    d = _timed_deepspark(step_seconds=0.001, rest_seconds=0.010)
    d.options = d.options.model_copy(update={"skip_when_slower": "always", "skip_min_batch": 1})
    d._closed, d._running, d._buckets, d.runner = True, 1, {}, SimpleNamespace(release=lambda rid: None)
    now = [0.0]
    d.clock = lambda: now[0]
    asked = []
    d.rates.speculate = lambda *a, **kw: asked.append(a) or (T, T)
    made = iter(range(10**6))

    def request(tokens=100, joined=False, status=RequestStatus.FINISHED_LENGTH, shared=False):
        r = SimpleNamespace(request_id=str(next(made)), num_output_tokens=1, status=RequestStatus.RUNNING,
                            params=SimpleNamespace(max_tokens=None))
        if shared:  # (it decoded beside another in the last round, which has finished)
            d._last_ids = {r.request_id, "other"}
        kinds = {d._choose([r]) for _ in range(3)}
        assert len(kinds) == 1 and not asked  # one kind, whole: no per-round choice, no sample
        (kind, sample), = kinds
        assert not sample and d.rests_above() == (None if kind else 1)
        if joined:
            d._choose([r, SimpleNamespace(request_id="joined", params=r.params)])
        now[0] += tokens * (spec_seconds if kind else 1.0)  # plain steps: 1 s a token
        r.num_output_tokens, r.status = 1 + tokens, status
        d.release(r)
        d._last_ids = {r.request_id}
        return kind

    kinds = [request() for _ in range(60)]
    fast, slow = (T, F) if spec_seconds < 0.85 else (F, T)  # (0.9: faster, but not by the margin)
    first = [T, F] if fast else [T]  # (plain steps' first measurement is the first of their run)
    assert kinds == first + [fast] * 7 + [slow] + [fast] * 15 + [slow] + [fast] * 31 + [slow] + [fast] * (
        60 - len(first) - 56)
    assert d.alone.rates.seconds == {(T, 1): spec_seconds, (F, 1): 1.0}
    before = {k: list(v) for k, v in d.alone.rates.rounds.items()}
    request(tokens=15)  # (too short to tell: its first round and a warm-up's first runs)
    assert request(shared=True) == fast  # (chosen as any, but past its first rounds)
    asked.clear()
    kind = request(joined=True)  # (a request joined it: the per-round rates chose that round)
    assert asked == [(2,)] and kind == fast
    asked.clear()
    request(status=RequestStatus.FINISHED_ABORTED)
    request(status=RequestStatus.PREEMPTED)  # (let go of, to come back later)
    assert {k: list(v) for k, v in d.alone.rates.rounds.items()} == before
    # a request decoding on its own while another runs (its prompt still computing) is not alone
    d._running = 2
    assert d._choose([SimpleNamespace(request_id="x", params=SimpleNamespace(max_tokens=None))]) == (T, T)
    assert asked == [(1,)] and d.alone.current is None
