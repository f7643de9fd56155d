"""Speculation at the end of the context: no draft is verified past max_model_len, and the draft
model computes no position past its own."""
from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from tests.plugins.test_spec_decode import DRAFTERS, _assert_pools_free
from tests.tiny_models import constant_model


@pytest.fixture(scope="module")
def short_pair(tmp_path_factory):
    """A target of 64 positions (so max_model_len 64) and a draft of 48, both of fixed distributions
    whose argmax is token 0: greedy requests generate 0s, and the draft model's drafts all pass."""
    target, draft = tmp_path_factory.mktemp("short_target"), tmp_path_factory.mktemp("short_draft")
    constant_model(target, [0.6, 0.1, 0.1, 0.2], max_position_embeddings=64)
    constant_model(draft, [0.5, 0.2, 0.2, 0.1], seed=1, max_position_embeddings=48)
    return str(target), str(draft)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafts_stop_at_the_end_of_the_context(drafter, short_pair):
    """Requests a few tokens short of max_model_len (61 of 64 tokens), or beyond where the draft's
    positions end (45 and 50 of its 48): the target verifies no draft past max_model_len and the
    draft computes no position past its own; greedy tokens as without a drafter, sampled requests
    end at max_model_len too, the pools all free."""
    target, draft = short_pair
    prompts = [{"prompt_token_ids": ([0, 0, 1, 2, 3] * 13)[:n]} for n in (61, 45, 50, 20)]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    opts = {} if drafter == "ngram" else {drafter: {"model": draft}}
    if drafter == "deepspark":  # (lookups would stand in for the draft model: ngram's case)
        opts[drafter] |= {"lookup": False, "skip_when_slower": "never"}
    llm = LLM(target, dtype="float32", plugins=[drafter], plugin_options=opts, progress=False)
    got = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [[0] * 3, [0] * 10, [0] * 10, [0] * 10]
    m = llm.get_metrics()
    assert m["deepinfer:spec_decode_num_accepted_tokens"] > 0
    sampled = [SamplingParams(temperature=0.8, seed=i, max_tokens=10, ignore_eos=True) for i in range(4)]
    got = llm.generate(prompts, sampled, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in got] == [3, 10, 10, 10]
    assert got[0].outputs[0].finish_reason == "length"
    _assert_pools_free(llm)
