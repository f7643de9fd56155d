"""A cache policy runs on rank 0 alone; the other ranks follow its block ids (the oracle: the
single-process engine's tokens). Its own module: one tensor-parallel engine a process, and the
module-scoped engines of test_tensor_parallel.py live until that module ends."""
from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from tests.tiny_models import make_model

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)



@pytest.mark.slow
def test_prefix_cache_hits_on_rank_0_give_the_same_tokens(tmp_path):
    """The cache policy runs on rank 0 alone: a hit sends the other ranks a step that starts past the
    cached prefix, whose KV they wrote into the same blocks of their own caches."""
    make_model(tmp_path, "qwen3")
    shared = list(range(20, 60))  # (five blocks of 8 in common)
    prompts = [{"prompt_token_ids": shared + tail} for tail in ([7, 8], [9], [10, 11, 12])]
    one = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=8, progress=False)
    want = [o.outputs[0].token_ids for o in one.generate(prompts, GREEDY, use_tqdm=False)]
    one.shutdown()
    two = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=8, progress=False, tensor_parallel_size=2,
              plugins=["prefix-cache"])
    try:
        two.generate(prompts[0], GREEDY, use_tqdm=False)  # (fills the cache)
        got = [o.outputs[0].token_ids for o in two.generate(prompts, GREEDY, use_tqdm=False)]
        hits = two.get_metrics()
    finally:
        two.shutdown()
    assert got == want
    assert hits["deepinfer:prefix_cache_hits"] >= 3 * 40  # (every prompt of the second call hit the shared blocks)
