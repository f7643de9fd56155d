"""The speculative metrics count what happened: a draft round once its drafts are verified (never a
proposal a preemption dropped), deepspark's rounds that verify none as proposed, and no draft
verified past a request's max_tokens."""
from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from tests.plugins.test_spec_decode import _assert_pools_free
from tests.tiny_models import constant_model

SPEC = "deepinfer:spec_decode_"


@pytest.fixture(scope="module")
def constant_pair(tmp_path_factory):
    """A target and a draft of fixed next-token distributions with the same argmax (token 0):
    greedy requests generate 0s and every greedy draft passes."""
    target, draft = tmp_path_factory.mktemp("metrics_target"), tmp_path_factory.mktemp("metrics_draft")
    constant_model(target, [0.6, 0.1, 0.1, 0.2])
    constant_model(draft, [0.5, 0.2, 0.2, 0.1], seed=1)
    return str(target), str(draft)


def _engine(drafter: str, draft: str, target: str, **kwargs) -> LLM:
    opts = {} if drafter == "ngram" else {drafter: {"model": draft, **kwargs.pop("options", {})}}
    return LLM(target, dtype="float32", plugins=[drafter], plugin_options=opts, progress=False, **kwargs)


def _count_verifications(llm: LLM) -> dict:
    """Wraps the drafter's ``observe`` (called once a request's verification is taken): the
    rounds and verified drafts it saw, and the drafts proposed in those rounds."""
    seen = {"rounds": 0, "verified": 0, "proposed": 0}
    drafter, observe = llm.engine.drafter, llm.engine.drafter.observe

    def counting(request, num_verified, num_accepted):
        seen["rounds"] += 1
        seen["verified"] += num_verified
        seen["proposed"] += len(request.draft.tokens)
        return observe(request, num_verified, num_accepted)

    drafter.observe = counting
    return seen


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_draft_rounds_are_counted_once_verified_under_preemption(drafter, constant_pair):
    """With a pool too small for the batch, requests are preempted with drafts proposed for them;
    the metrics count exactly the verified rounds, their proposed and verified drafts."""
    target, draft = constant_pair
    prompts = [{"prompt_token_ids": [1 + i, 2, 3, 0, 0, 0]} for i in range(6)]
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = _engine(drafter, draft, target, block_size=4, num_kv_blocks=20, max_model_len=64)
    seen = _count_verifications(llm)
    out = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [[0] * 40] * 6
    m = llm.get_metrics()
    assert m["deepinfer:num_preemptions"] > 0 and seen["rounds"] > 0
    assert m[SPEC + "num_drafts"] == seen["rounds"]
    assert m[SPEC + "num_draft_tokens"] == seen["proposed"]
    assert m[SPEC + "num_verified_tokens"] == seen["verified"]
    _assert_pools_free(llm)


def test_deepspark_rounds_that_verify_nothing_count_as_proposed(constant_pair):
    """With ``min_value`` 0.99 no draft is worth verifying: every round's drafts count as
    proposed (what the draft model drafted), none as verified."""
    target, draft = constant_pair
    options = {"min_value": 0.99, "early_stop": False, "cost_aware": False, "lookup": False,
               "skip_when_slower": "never"}
    llm = _engine("deepspark", draft, target, options=options)
    runner, made = llm.engine.drafter.runner, {"rounds": 0, "tokens": 0}
    propose = runner.propose

    def counting(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        made["rounds"] += len(drafts)
        made["tokens"] += sum(len(d.tokens) for d in drafts.values())
        return drafts

    runner.propose = counting
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                       use_tqdm=False)
    assert out[0].outputs[0].token_ids == [0] * 10
    m = llm.get_metrics()
    assert made["rounds"] > 0
    assert (m[SPEC + "num_drafts"], m[SPEC + "num_draft_tokens"]) == (made["rounds"], made["tokens"])
    assert m[SPEC + "num_verified_tokens"] == 0
    _assert_pools_free(llm)


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_no_draft_is_verified_past_max_tokens(drafter, constant_pair):
    """Every draft passes here, so without the cap a request with 3 tokens left would verify all it
    proposes (draft-model: 5). max_tokens 4: the prompt's step gives the first token, then one
    round verifies at most the 2 drafts that leave room for the target's token (draft-model: those
    2; ngram proposes one token here); max_tokens 2: no round at all."""
    target, draft = constant_pair
    llm = _engine(drafter, draft, target)
    prompts = [{"prompt_token_ids": [0, 0, 0, 0, 0, 0, 0, 0]}] * 3
    for max_tokens, verified in ((4, 2), (2, 0)):
        before = llm.get_metrics()
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                           use_tqdm=False)
        assert [o.outputs[0].token_ids for o in out] == [[0] * max_tokens] * 3
        m = {k: v - before.get(k, 0) for k, v in llm.get_metrics().items()}
        assert m[SPEC + "num_verified_tokens"] == m[SPEC + "num_accepted_tokens"]
        if drafter == "draft-model":
            assert m[SPEC + "num_verified_tokens"] == 3 * verified
        assert 3 * min(1, verified) <= m[SPEC + "num_verified_tokens"] <= 3 * verified
        assert m[SPEC + "num_drafts"] == (3 if verified else 0)
    _assert_pools_free(llm)


def test_acceptance_by_position_in_get_metrics_and_as_one_labelled_family_in_prometheus(constant_pair):
    """Every position up to k is there from the start (0 before any round); /metrics renders
    the engine's per-position counters as one family labelled by position, vLLM's form, with the
    values get_metrics gives."""
    from prometheus_client.parser import text_string_to_metric_families

    from deepinfer.serve.metrics import ServerMetrics

    target, draft = constant_pair
    llm = _engine("draft-model", draft, target)
    positions = [f"{SPEC}num_accepted_tokens_pos_{i}" for i in range(5)]
    assert [llm.get_metrics()[p] for p in positions] == [0] * 5
    llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                 use_tqdm=False)
    m = llm.get_metrics()
    accepted = [m[p] for p in positions]
    assert sum(accepted) == m[SPEC + "num_accepted_tokens"] > 0
    server = ServerMetrics()
    server.update_engine({"counters": dict(llm.engine.metrics.counters), "gauges": {}, "histograms": {}})
    families = {f.name: f for f in text_string_to_metric_families(server.render().decode())}
    family = families[SPEC + "num_accepted_tokens_per_pos"]
    by_position = {int(s.labels["position"]): s.value for s in family.samples if s.name.endswith("_total")}
    assert by_position == dict(enumerate(accepted))
    assert not any("_pos_" in name for name in families)
    assert families[SPEC + "num_accepted_tokens"].samples[0].value == m[SPEC + "num_accepted_tokens"]
