"""prefix-cache: same outputs as no cache, only uncached tokens computed, tenants kept apart."""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from tests.tiny_models import hybrid, make_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3pc")
    make_model(path, "qwen3", **hybrid(10))
    return str(path)


def _llm(model_dir, cache: bool, **kw) -> LLM:
    return LLM(model_dir, dtype="float32", block_size=4, plugins=["prefix-cache"] if cache else [],
               progress=False, **kw)


def _assert_pool_exact(llm: LLM) -> None:
    pool = llm.engine.kv.pool
    pool.check_all_free()  # nothing referenced: every block free or cached with zero references
    policy = llm.engine.kv.policies[0]
    hashed = [b for b in pool.blocks if b.block_hash is not None]
    assert len(hashed) == len(policy.cached)
    assert all(policy.cached[b.block_hash] is b for b in hashed)


def _shared_prefix_prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    roots = [[rng.randrange(6, 320) for _ in range(60)] for _ in range(3)]
    out = []
    for _ in range(n):
        root = rng.choice(roots)
        k = rng.randrange(0, 61)  # shared prefixes of many lengths, block-aligned or not
        out.append(root[:k] + [rng.randrange(6, 320) for _ in range(rng.randrange(1, 12))])
    return out


def test_outputs_identical_with_and_without_cache_under_eviction_and_preemption(model_dir):
    prompts = _shared_prefix_prompts(0, 40)
    ref_llm = _llm(model_dir, cache=False)
    ref = [o.outputs[0].token_ids for o in ref_llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                            use_tqdm=False)]
    # a 30-block pool (120 tokens) cannot keep every prefix: eviction; batches of 40 preempt
    llm = _llm(model_dir, cache=True, num_kv_blocks=30, max_model_len=96, max_num_batched_tokens=32)
    for _ in range(2):  # the second pass hits what the first left cached
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                            use_tqdm=False)]
        assert got == ref
    m = llm.get_metrics()
    assert m["deepinfer:prefix_cache_hits"] > 0
    assert m["deepinfer:prefix_cache_evicted_blocks"] > 0
    assert m["deepinfer:num_preemptions"] > 0
    _assert_pool_exact(llm)
    # one at a time, in sequence, too
    for p, r in zip(prompts[:10], ref[:10], strict=True):
        assert llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == r
    _assert_pool_exact(llm)


def test_only_uncached_tokens_are_computed(model_dir):
    llm = _llm(model_dir, cache=True)
    base = list(range(10, 50))  # 40 tokens = 10 full blocks
    llm.generate({"prompt_token_ids": base}, GREEDY, use_tqdm=False)
    m0 = llm.get_metrics()["deepinfer:prompt_tokens_computed"]
    assert m0 == 40
    out = llm.generate({"prompt_token_ids": base + list(range(60, 70))}, GREEDY, use_tqdm=False)[0]
    m1 = llm.get_metrics()["deepinfer:prompt_tokens_computed"]
    assert m1 - m0 == 10 and out.num_cached_tokens == 40
    # the same prompt again: everything but the last block (its last token must be computed)
    out = llm.generate({"prompt_token_ids": base}, GREEDY, use_tqdm=False)[0]
    assert llm.get_metrics()["deepinfer:prompt_tokens_computed"] - m1 == 4 and out.num_cached_tokens == 36
    m = llm.get_metrics()
    assert m["deepinfer:prefix_cache_queries"] == 40 + 50 + 40
    assert m["deepinfer:prefix_cache_hits"] == 0 + 40 + 36
    _assert_pool_exact(llm)


def test_tenants_with_different_salts_never_share(model_dir):
    llm = _llm(model_dir, cache=True)
    prompt = list(range(20, 60))
    llm.generate({"prompt_token_ids": prompt, "cache_salt": "tenant-a"}, GREEDY, use_tqdm=False)
    other = llm.generate({"prompt_token_ids": prompt, "cache_salt": "tenant-b"}, GREEDY, use_tqdm=False)[0]
    unsalted = llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
    same = llm.generate({"prompt_token_ids": prompt, "cache_salt": "tenant-a"}, GREEDY, use_tqdm=False)[0]
    assert other.num_cached_tokens == 0 and unsalted.num_cached_tokens == 0
    assert same.num_cached_tokens == 36
    assert same.outputs[0].token_ids == other.outputs[0].token_ids == unsalted.outputs[0].token_ids


def test_requests_arriving_together_compute_a_shared_prefix_once(model_dir):
    llm = _llm(model_dir, cache=True, max_num_batched_tokens=16)
    prefix = list(range(100, 164))  # 64 tokens, 16 blocks
    prompts = [prefix + [7 + i, 8 + i, 9 + i] for i in range(4)]
    ref = [o.outputs[0].token_ids for o in _llm(model_dir, cache=False).generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == ref
    assert llm.get_metrics()["deepinfer:prompt_tokens_computed"] == 64 + 4 * 3
    _assert_pool_exact(llm)


def test_hash_collisions_cannot_change_output(model_dir, monkeypatch):
    import deepinfer_builtin.cache.prefix_cache as pc

    prompts = _shared_prefix_prompts(1, 12)
    ref = [o.outputs[0].token_ids for o in _llm(model_dir, cache=False).generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)]
    monkeypatch.setattr(pc, "block_key", lambda parent, tokens, salt: b"same-key-for-all")
    llm = _llm(model_dir, cache=True)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                        use_tqdm=False)]
    assert got == ref
    llm.engine.kv.pool.check_all_free()


def test_lru_eviction_takes_tail_blocks_first(model_dir):
    llm = _llm(model_dir, cache=True, num_kv_blocks=26, max_model_len=100)
    a = list(range(10, 50))
    llm.generate({"prompt_token_ids": a}, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    # an unrelated 80-token prompt needs 20 blocks: the 16 never-used ones, then 4 of a's 10 cached
    # blocks, which must be its last four
    llm.generate({"prompt_token_ids": list(range(200, 280))}, SamplingParams(temperature=0, max_tokens=1),
                 use_tqdm=False)
    hit = llm.generate({"prompt_token_ids": a}, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert hit.num_cached_tokens == 24  # the head's 6 blocks survived
    _assert_pool_exact(llm)
