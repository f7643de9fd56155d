"""deepspark's plain rounds with overlap scheduling (``overlap_plain_rounds``): the engine leaves a
step running while the drafter chooses the next round's kind (``SkipsRounds.needs_tokens``), takes it
first for a round that drafts, and nothing changes but the order: the same greedy tokens as the
target alone, through preemption, stops, aborts with a step in flight, requests joining at any
step and every kind of sampling; no placeholder ever reaches the draft, no verification starts
while a step is left running, and every pool is free after.

The CPU runs steps synchronously, so the engine's overlapped path is switched on by hand, as in
tests/core/test_overlap.py."""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from tests.plugins.test_spec_decode import _assert_pools_free
from tests.tiny_models import make_model

PROMPTS = [[7 + i, 8, 9, 10, 11] * (1 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a draft with its weights (so drafts are accepted, and rounds vary)."""
    target, draft = tmp_path_factory.mktemp("t"), tmp_path_factory.mktemp("d")
    make_model(target, "llama", seed=0)
    make_model(draft, "llama", seed=0)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def reference(pair):
    """Greedy requests, half stopping on a token they produce, and the target's outputs alone."""
    target = pair[0]
    alone = LLM(target, dtype="float32", block_size=4, progress=False)
    long = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in alone.generate([{"prompt_token_ids": p} for p in PROMPTS], long,
                                                            use_tqdm=False)]
    params = [SamplingParams(temperature=0, max_tokens=10 + 2 * i, stop_token_ids=[toks[5 + i % 4]]) if i % 2
              else SamplingParams(temperature=0, max_tokens=10 + 2 * i, ignore_eos=True) for i, toks in enumerate(first)]
    outs = alone.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return params, [o.outputs[0].token_ids for o in outs]


def _engine(pair, seed: int):
    """deepspark with overlapped plain rounds, each round's kind drawn at random, guarded."""
    target, draft = pair
    llm = LLM(target, dtype="float32", block_size=4, num_kv_blocks=24, max_model_len=64, plugins=["deepspark"],
              progress=False, plugin_options={"deepspark": {
                  "model": draft, "overlap_plain_rounds": True, "skip_when_slower": "always", "skip_min_batch": 1,
                  "min_value": 0.0, "cost_aware": False}})
    eng, rng = llm.engine, random.Random(seed)
    assert eng.drafter.skips_rounds
    eng.overlap = True
    eng.drafter.rates.speculate = lambda batch, *rest: (rng.random() < 0.5, False)
    seen = {"deferred": 0, "verified": 0, True: 0, False: 0}
    propose, launch, begin, needs = (eng.drafter.runner.propose, eng.runner.launch, eng._leave_running,
                                     eng.drafter.needs_tokens)

    def drafting(requests, *a, **kw):
        assert not any(r.num_pending for r in requests)
        return propose(requests, *a, **kw)

    def launching(sched):
        if sched.draft_tokens:
            seen["verified"] += 1
            assert eng.in_flight is None  # no verification while a step is left running
        return launch(sched)

    def deferring(flight):
        seen["deferred"] += 1
        return begin(flight)

    def asked(requests):
        answer = needs(requests)
        seen[answer] += 1
        return answer

    eng.drafter.runner.propose, eng.runner.launch, eng._leave_running = drafting, launching, deferring
    eng.drafter.needs_tokens = asked
    return llm, seen


@pytest.mark.parametrize("seed", range(3))
def test_overlapped_plain_rounds_change_no_output(pair, reference, seed):
    params, want = reference
    llm, seen = _engine(pair, seed)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                        use_tqdm=False)]
    assert got == want
    assert llm.get_metrics()["deepinfer:num_preemptions"] > 0
    assert seen["deferred"] > 0 and seen["verified"] > 0 and seen[True] > 0 and seen[False] > 0
    _assert_pools_free(llm)


@pytest.mark.parametrize("seed", range(2))
def test_joins_aborts_and_sampling_with_overlapped_plain_rounds(pair, reference, seed):
    params, want = reference
    llm, seen = _engine(pair, 100 + seed)
    eng, rng = llm.engine, random.Random(seed)
    extra = {3: ("s", SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=12, ignore_eos=True)),
             4: ("m", SamplingParams(temperature=0, max_tokens=14, min_tokens=6, ignore_eos=True)),
             5: ("l", SamplingParams(temperature=0, max_tokens=8, logprobs=2, ignore_eos=True))}
    pending, done, aborted, steps = list(enumerate(PROMPTS)), {}, set(), 0
    while pending or eng.has_unfinished_requests():
        if pending and rng.random() < 0.4:  # requests join at any step
            i, p = pending.pop(0)
            eng.add_request(f"g{i}", p, params[i])
            if i in extra:
                eng.add_request(extra[i][0], p, extra[i][1])
        done.update((o.request_id, o) for o in eng.step() if o.finished)
        steps += 1
        live = [r for r in eng.requests if r.startswith("g")]
        # two aborts, each at the first step from 7 (then 13) that leaves a step in flight
        if len(aborted) < 2 and steps >= 7 + 6 * len(aborted) and live and eng.in_flight is not None:
            victim = live[rng.randrange(len(live))]
            assert eng.abort_request(victim)
            aborted.add(victim)
    for i, tokens in enumerate(want):
        if f"g{i}" not in aborted:
            assert done[f"g{i}"].outputs[0].token_ids == tokens
    assert len(done["s"].outputs) == 2 and len(done["m"].outputs[0].token_ids) == 14
    assert aborted and seen["deferred"] > 0
    _assert_pools_free(llm)


def test_a_drafter_that_drafts_after_saying_it_would_not_is_refused(pair):
    from deepinfer.plugins import DraftProposal

    llm, _ = _engine(pair, 0)
    eng = llm.engine
    eng.drafter.needs_tokens = lambda requests: False  # and then it drafts anyway
    eng.drafter.propose = lambda requests: {r.request_id: DraftProposal([5], None, 1) for r in requests}
    eng.add_request("a", PROMPTS[0], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    with pytest.raises(RuntimeError, match="needs_tokens"):
        for _ in range(12):
            eng.step()
