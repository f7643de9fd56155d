"""swa-replay: outputs of an engine with no cache, replay bounded by R, live sliding KV bounded by
the window, exact pool accounting, and clear refusals.

Oracles: the engine with no cache (greedy, float32), whose agreement with transformers on these
hybrid models tests/models and tests/plugins/test_prefix_cache establish; counted invariants.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.plugins import PluginError
from tests.interpreter import run_interpreted
from tests.tiny_models import hybrid, make_model

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("sliding_attention", "full_attention", "sliding_attention")
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", params=[10, 8], ids=["window10", "window8"])
def model_dir(request, tmp_path_factory) -> str:
    """Windows that are not (10) and are (8) a multiple of the block size 4."""
    path = tmp_path_factory.mktemp(f"qwen3swa{request.param}")
    make_model(path, "qwen3", **hybrid(request.param, LAYERS))
    return str(path)


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory) -> str:
    """Window 10 only, for the tests that need not run on both windows."""
    path = tmp_path_factory.mktemp("qwen3swa-one")
    make_model(path, "qwen3", with_tokenizer=False, **hybrid(10, LAYERS))
    return str(path)


def _swa(model_dir: str, interval: int = 8, sliding_blocks: int | None = None, **kw) -> LLM:
    opts = {"replay_interval": interval}
    if sliding_blocks is not None:
        opts["sliding_pool_blocks"] = sliding_blocks
    kw = {"dtype": "float32", "block_size": 4, **kw}
    return LLM(model_dir, plugins=["prefix-cache", "swa-replay"], plugin_options={"swa-replay": opts},
               progress=False, **kw)


def _reference(model_dir: str, prompts: list[list[int]], params=GREEDY, **kw) -> list[list[int]]:
    llm = LLM(model_dir, progress=False, **{"dtype": "float32", "block_size": 4, **kw})
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                         use_tqdm=False)]


def _conversations(seed: int, n: int, turns: int, vocab: int = 320, first: int = 6, step: int = 14,
                   diverge: float = 0.35) -> list[list[int]]:
    """Multi-turn prompts: each turn extends its conversation; some branch off mid-context."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ctx = [rng.randrange(6, vocab) for _ in range(first)]
        for _ in range(turns):
            ctx = ctx + [rng.randrange(6, vocab) for _ in range(rng.randrange(3, step))]
            out.append(list(ctx))
            if rng.random() < diverge:
                cut = rng.randrange(len(ctx) // 2, len(ctx))
                out.append(ctx[:cut] + [rng.randrange(6, vocab) for _ in range(rng.randrange(1, 6))])
    return out


def assert_pools_exact(llm: LLM) -> None:
    """Nothing referenced in either pool; hashes exactly where the policies say they keep something."""
    kv = llm.engine.kv
    prefix, swa = kv.policies
    kv.pool.check_all_free()
    kv.sliding.pool.check_all_free()
    hashed = [b for b in kv.pool.blocks if b.block_hash is not None]
    assert len(hashed) == len(prefix.cached) and all(prefix.cached[b.block_hash] is b for b in hashed)
    kept = {b.block_id for b in kv.sliding.pool.blocks if b.block_hash is not None}
    assert kept == set(swa.users)
    assert kept == {b.block_id for ck in swa.checkpoints.values() for b in ck.blocks}
    assert all(key in swa.users[b.block_id] for key, ck in swa.checkpoints.items() for b in ck.blocks)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_outputs_equal_no_cache_batched_and_turn_by_turn_under_eviction(model_dir, overlap):
    prompts = _conversations(0, 5, 5)
    ref = _reference(model_dir, prompts)
    # small pools: both evict (prefix blocks and checkpoints)
    llm = _swa(model_dir, sliding_blocks=24, num_kv_blocks=40, max_model_len=96, max_num_batched_tokens=16)
    llm.engine.overlap = overlap  # as on a GPU: window release and checkpoints while a step is in flight
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                        use_tqdm=False)]
    assert got == ref
    for p, r in zip(prompts, ref, strict=True):  # one at a time: every later turn hits the cache
        assert llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == r
    m = llm.get_metrics()
    assert m["deepinfer:swa_replay_restores"] > 0 and m["deepinfer:prefix_cache_hits"] > 0
    assert m["deepinfer:prefix_cache_evicted_blocks"] > 0 and m["deepinfer:swa_replay_dropped_checkpoints"] > 0
    assert m["deepinfer:swa_replay_max_restore_tokens"] < 8  # restores whose nearest checkpoint survived
    assert_pools_exact(llm)


def test_each_hit_replays_the_distance_to_its_checkpoint(model_dir):
    """A hit at P resumes at the checkpoint floor(P / R) * R: hits at, before and after checkpoints."""
    rng = random.Random(3)
    base = [rng.randrange(6, 320) for _ in range(60)]
    # shared prefixes of 32 (a checkpoint), 28 and 30 (before 32), 37 and 45 (after 32 / 40) tokens
    prompts = [base] + [base[:k] + [rng.randrange(6, 320) for _ in range(5)] for k in (32, 28, 30, 37, 45, 60)]
    ref = _reference(model_dir, prompts)
    llm = _swa(model_dir, interval=8)
    replays = []
    for p, r in zip(prompts, ref, strict=True):
        before = llm.get_metrics()
        assert llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == r
        after = llm.get_metrics()
        hit = after["deepinfer:prefix_cache_hits"] - before["deepinfer:prefix_cache_hits"]
        replayed = after["deepinfer:swa_replay_tokens"] - before["deepinfer:swa_replay_tokens"]
        computed = after["deepinfer:prompt_tokens_computed"] - before["deepinfer:prompt_tokens_computed"]
        assert replayed == hit % 8  # the checkpoint at floor(hit / 8) * 8 survived
        assert computed == len(p) - hit + replayed
        replays.append(replayed)
    assert 0 in replays[1:] and any(replays)
    assert llm.get_metrics()["deepinfer:swa_replay_misses"] == 0
    assert_pools_exact(llm)


def test_without_surviving_checkpoints_hits_replay_from_the_start(hybrid_dir):
    prompt = list(range(20, 70))
    ref = _reference(hybrid_dir, [prompt])
    llm = _swa(hybrid_dir, interval=8, sliding_blocks=9, max_num_batched_tokens=16, max_model_len=64)
    assert llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == ref[0]
    # an unrelated request fills the small sliding pool: every checkpoint of the first is evicted
    llm.generate({"prompt_token_ids": list(range(100, 150))}, GREEDY, use_tqdm=False)
    m0 = llm.get_metrics()
    assert llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == ref[0]
    m = llm.get_metrics()
    hit = m["deepinfer:prefix_cache_hits"] - m0["deepinfer:prefix_cache_hits"]
    assert hit == 48 and m["deepinfer:swa_replay_tokens"] - m0["deepinfer:swa_replay_tokens"] == hit
    assert m["deepinfer:swa_replay_misses"] - m0["deepinfer:swa_replay_misses"] == 1
    assert_pools_exact(llm)


@pytest.mark.slow
def test_live_sliding_blocks_stay_within_the_window_on_a_16k_prompt(tmp_path):
    window, bs = 64, 16
    make_model(tmp_path, "qwen3", with_tokenizer=False, max_position_embeddings=16512,
               **hybrid(window, ("sliding_attention", "full_attention")))
    llm = _swa(str(tmp_path), interval=128, sliding_blocks=64, block_size=bs, num_kv_blocks=1040,
               max_model_len=16512, max_num_batched_tokens=512)
    eng = llm.engine
    prompt = [6 + (i * 7919) % 300 for i in range(16384)]
    eng.add_request("long", prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    req = eng.scheduler.waiting[0]
    peak_live, peak_full = 0, 0
    while eng.has_unfinished_requests():
        eng.step()
        if not req.status.finished:
            peak_live = max(peak_live, eng.kv.num_live_sliding_blocks(req))
            full = len(eng.kv.blocks_of(req))
            assert full == -(-req.num_computed_tokens // bs)  # full-attention layers keep every token
            peak_full = max(peak_full, full)
    assert req.num_computed_tokens >= 16384
    assert peak_full >= 16384 // bs
    assert 0 < peak_live <= -(-window // bs) + 2
    assert llm.get_metrics()["deepinfer:swa_replay_dropped_checkpoints"] > 0  # 128 checkpoints, 64 blocks
    assert_pools_exact(llm)


@pytest.mark.slow
def test_demo_model_outputs_equal_no_cache_with_eviction():
    """The demo target (window 256, 3 sliding : 1 full layers) with R = 128 and block size 16."""
    rng = random.Random(5)
    root = [rng.randrange(10, 8192) for _ in range(520)]
    prompts = [root[:300], root[:300] + root[400:420], root[:520], root[:384] + [11, 12, 13],
               root[:130] + [14, 15], root[:520] + [16] * 40, root[:200] + [17]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ref = _reference(None, prompts, params, block_size=16)
    llm = _swa(None, interval=128, sliding_blocks=40, block_size=16, num_kv_blocks=40, max_model_len=640,
               max_num_batched_tokens=256)
    for p, r in zip(prompts, ref, strict=True):
        assert llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].outputs[0].token_ids == r
    m = llm.get_metrics()
    assert m["deepinfer:swa_replay_restores"] > 0 and m["deepinfer:swa_replay_max_restore_tokens"] <= 128
    assert m["deepinfer:prefix_cache_evicted_blocks"] > 0 and m["deepinfer:swa_replay_dropped_checkpoints"] > 0
    assert_pools_exact(llm)


def test_speculative_decoding_stays_lossless_with_replay(hybrid_dir):
    """The target as its own draft model: drafts are proposed every step and mostly accepted."""
    rng = random.Random(7)
    base = [rng.randrange(6, 320) for _ in range(44)]
    prompts = [base[:40], base[:30] + [9, 10]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ref = _reference(hybrid_dir, prompts, params)
    llm = LLM(hybrid_dir, dtype="float32", block_size=4, progress=False,
              plugins=["prefix-cache", "swa-replay", "draft-model"],
              plugin_options={"swa-replay": {"replay_interval": 8}, "draft-model": {"model": hybrid_dir}})
    for p, r in zip(prompts, ref, strict=True):
        assert llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].outputs[0].token_ids == r
    m = llm.get_metrics()
    assert m["deepinfer:spec_decode_num_accepted_tokens"] > 0 and m["deepinfer:swa_replay_restores"] > 0
    assert_pools_exact(llm)


# ---------------------------------------------------------------------------------------- refusals
def test_without_prefix_cache_is_refused_naming_both(hybrid_dir):
    with pytest.raises(PluginError, match=r"'swa-replay' needs plugin 'prefix-cache'.*prefix-cache,swa-replay"):
        LLM(hybrid_dir, plugins=["swa-replay"], progress=False)


def test_listed_before_prefix_cache_is_refused(hybrid_dir):
    with pytest.raises(PluginError, match="list prefix-cache first"):
        LLM(hybrid_dir, plugins=["swa-replay", "prefix-cache"], progress=False)


def test_model_without_sliding_window_layers_is_refused(tmp_path):
    make_model(tmp_path, "qwen3", with_tokenizer=False)
    with pytest.raises(PluginError, match="no sliding-window layers; drop it"):
        LLM(str(tmp_path), plugins=["prefix-cache", "swa-replay"], progress=False)


@pytest.mark.parametrize("interval, message", [(6, r"replay_interval.* is 6, not a multiple of block_size 4"),
                                               (0, r"replay_interval\n.*greater than 0"),
                                               (-4, r"replay_interval\n.*greater than 0")])
def test_bad_replay_interval_says_what_is_valid(hybrid_dir, interval, message):
    with pytest.raises(PluginError, match=message):
        _swa(hybrid_dir, interval=interval)


def test_sliding_pool_too_small_for_one_request_is_refused(hybrid_dir):
    with pytest.raises(ValueError, match=r"sliding-window KV pool has 3 blocks of 4 tokens; one request needs"):
        _swa(hybrid_dir, sliding_blocks=3, max_num_batched_tokens=32)


def test_attention_without_kv_groups_is_refused(hybrid_dir, monkeypatch):
    from deepinfer_builtin.attention.torch_attn import TorchAttention

    monkeypatch.setattr(TorchAttention, "supports_kv_groups", False)
    with pytest.raises(PluginError, match="attention plugin 'torch' cannot keep the sliding-window layers' KV"):
        _swa(hybrid_dir)


# ------------------------------------------------------------------------------ triton interpreter
@pytest.mark.slow
def test_triton_interpreter_with_replay_gives_the_no_cache_tokens(hybrid_dir):
    res = run_interpreted(["-m", "tests.plugins.test_swa_replay", hybrid_dir])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["triton"] == got["reference"] and got["restores"] > 0 and got["replayed"] > 0


def _main(model_dir: str) -> None:
    """Child of the interpreter test: no-cache torch tokens and swa-replay triton tokens, as JSON."""
    rng = random.Random(11)
    base = [rng.randrange(6, 320) for _ in range(30)]
    prompts = [base, base[:22] + [7, 8], base + [9, 10, 11]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = {"device": "cpu", "num_kv_blocks": 64, "max_model_len": 64, "max_num_batched_tokens": 16}
    ref = _reference(model_dir, prompts, params, **engine)
    llm = LLM(model_dir, plugins=["triton", "prefix-cache", "swa-replay"], dtype="float32", block_size=4,
              plugin_options={"swa-replay": {"replay_interval": 8}}, progress=False, **engine)
    got = [llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    m = llm.get_metrics()
    print(json.dumps({"reference": ref, "triton": got, "restores": m["deepinfer:swa_replay_restores"],
                      "replayed": m["deepinfer:swa_replay_tokens"]}))


if __name__ == "__main__":
    _main(sys.argv[1])
