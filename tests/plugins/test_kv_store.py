"""kv-store through the engine: outputs equal an engine without cache (the oracle), a restart keeps
the prefix-cache hit rate of multi-turn conversations, damaged block files are recomputed, tenants'
salts and retention classes hold, and every block is free after each load."""
from __future__ import annotations

import glob
import os
import random

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.plugins import PluginError
from tests.tiny_models import make_model

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
DAY = 86400.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llamakv")
    make_model(path, "llama")
    return str(path)


@pytest.fixture(scope="module")
def ref(model_dir):
    return _llm(model_dir, None, cache=False)


def _llm(model_dir, store: str | None, cache: bool = True, **kw) -> LLM:
    plugins = (["kv-store"] if store is not None else ["prefix-cache"]) if cache else []
    opts = {"kv-store": {"directory": store, "fsync": False}} if store is not None else {}
    return LLM(model_dir, dtype="float32", block_size=4, plugins=plugins, plugin_options=opts, progress=False, **kw)


def _run(llm: LLM, prompts, params=GREEDY, salt=None) -> list[list[int]]:
    batch = [{"prompt_token_ids": p, **({"cache_salt": salt} if salt else {})} for p in prompts]
    return [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]


def _hit_rate(llm: LLM, outs_before: dict) -> float:
    m = llm.get_metrics()
    q = m["deepinfer:prefix_cache_queries"] - outs_before["q"]
    return (m["deepinfer:prefix_cache_hits"] - outs_before["h"]) / q


def _counts(llm: LLM) -> dict:
    m = llm.get_metrics()
    return {"q": m["deepinfer:prefix_cache_queries"], "h": m["deepinfer:prefix_cache_hits"]}


def _conversations(ref: LLM, n: int, turns: int, seed: int = 0) -> list[list[tuple[list[int], list[int]]]]:
    """Each turn's prompt is the whole history plus a new user message; the oracle's answers."""
    rng = random.Random(seed)
    history = [[rng.randrange(6, 320) for _ in range(rng.randrange(8, 24))] for _ in range(n)]
    out: list[list[tuple[list[int], list[int]]]] = [[] for _ in range(turns)]
    for t in range(turns):
        prompts = [h + [rng.randrange(6, 320) for _ in range(rng.randrange(3, 9))] for h in history]
        answers = _run(ref, prompts)
        out[t] = list(zip(prompts, answers, strict=True))
        history = [p + a for p, a in zip(prompts, answers, strict=True)]
    return out


def _stop(llm: LLM) -> None:
    llm.engine.kv.pool.check_all_free()
    llm.shutdown()


@pytest.mark.slow
def test_restart_keeps_hit_rate_and_outputs(model_dir, ref, tmp_path):
    turns = _conversations(ref, n=6, turns=4)
    first = _llm(model_dir, str(tmp_path))
    rates = []
    for t in range(2):  # turn 2 hits what turn 1 left on the device
        before = _counts(first)
        assert _run(first, [p for p, _ in turns[t]]) == [a for _, a in turns[t]]
        rates.append(_hit_rate(first, before))
    _stop(first)
    second = _llm(model_dir, str(tmp_path))  # a new engine: its device pool starts empty
    before = _counts(second)
    assert _run(second, [p for p, _ in turns[2]]) == [a for _, a in turns[2]]
    after_restart = _hit_rate(second, before)
    assert after_restart >= 0.9 * rates[1] > 0
    m = second.get_metrics()
    assert m["deepinfer:kv_store_disk_hits"] > 0 and m["deepinfer:kv_store_disk_corrupt"] == 0
    assert _run(second, [p for p, _ in turns[3]]) == [a for _, a in turns[3]]
    _stop(second)


@pytest.mark.slow
def test_host_tier_serves_what_the_device_pool_evicted(model_dir, ref):
    rng = random.Random(1)
    prompts = [[rng.randrange(6, 320) for _ in range(40)] for _ in range(8)]
    want = _run(ref, prompts)
    llm = LLM(model_dir, dtype="float32", block_size=4, plugins=["kv-store"], progress=False,
              num_kv_blocks=40, max_model_len=64)  # 40 blocks keep about three of the prompts
    for _ in range(2):
        for p, r in zip(prompts, want, strict=True):
            assert _run(llm, [p]) == [r]
        llm.engine.kv.policies[0].flush()
    m = llm.get_metrics()
    assert m["deepinfer:prefix_cache_evicted_blocks"] > 0 and m["deepinfer:kv_store_host_hits"] > 0
    assert m["deepinfer:kv_store_disk_hits"] == 0
    _stop(llm)


@pytest.mark.slow
def test_damaged_block_files_are_recomputed_never_served(model_dir, ref, tmp_path):
    rng = random.Random(2)
    prompts = [[rng.randrange(6, 320) for _ in range(30)] for _ in range(3)]
    want = _run(ref, prompts)
    first = _llm(model_dir, str(tmp_path))
    assert _run(first, prompts) == want
    _stop(first)
    files = sorted(glob.glob(os.path.join(tmp_path, "*", "*", "*", "*.kvb")))
    with open(files[0], "r+b") as f:  # cut short
        f.truncate(os.path.getsize(files[0]) - 10)
    with open(files[1], "r+b") as f:  # a flipped byte in its KV
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    second = _llm(model_dir, str(tmp_path))
    assert _run(second, prompts) == want
    m = second.get_metrics()
    assert m["deepinfer:kv_store_disk_corrupt"] == 2 and m["deepinfer:kv_store_disk_hits"] > 0
    _stop(second)


def test_two_salts_never_share_an_entry(model_dir, tmp_path):
    prompt = list(range(10, 50))
    first = _llm(model_dir, str(tmp_path))
    _run(first, [prompt], salt="tenant-a")
    _stop(first)
    files_a = set(glob.glob(os.path.join(tmp_path, "*", "*", "*", "*.kvb")))
    second = _llm(model_dir, str(tmp_path))
    out = second.generate({"prompt_token_ids": prompt, "cache_salt": "tenant-b"}, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    second.engine.kv.policies[0].flush()
    files_b = set(glob.glob(os.path.join(tmp_path, "*", "*", "*", "*.kvb"))) - files_a
    assert len(files_b) == len(files_a) > 0  # the same blocks again, under other keys
    out = second.generate({"prompt_token_ids": prompt, "cache_salt": "tenant-a"}, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 36  # tenant a's own entries, read from the directory
    _stop(second)


@pytest.mark.slow
def test_retention_classes_expire_under_a_test_clock(model_dir, tmp_path):
    agent, chat = list(range(10, 40)), list(range(50, 80))
    first = _llm(model_dir, str(tmp_path))
    first.generate([{"prompt_token_ids": agent}], GREEDY.model_copy(update={"kv_retention": "agent"}),
                   use_tqdm=False)
    first.generate([{"prompt_token_ids": chat}], GREEDY.model_copy(update={"kv_retention": "chat"}),
                   use_tqdm=False)
    _stop(first)
    assert glob.glob(os.path.join(tmp_path, "*", "agent", "*", "*.kvb"))
    second = _llm(model_dir, str(tmp_path))
    policy = second.engine.kv.policies[0]
    real = policy.clock
    policy.clock = lambda: real() + 4 * DAY  # past the agent class's 3 days, within chat's 7
    outs = second.generate([{"prompt_token_ids": agent}, {"prompt_token_ids": chat}], GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens for o in outs] == [0, 28]
    _stop(second)


def test_unknown_default_retention_is_refused(model_dir, tmp_path):
    with pytest.raises((PluginError, ValueError), match="default_retention"):
        LLM(model_dir, dtype="float32", plugins=["kv-store"], progress=False,
            plugin_options={"kv-store": {"directory": str(tmp_path), "default_retention": "forever"}})


@pytest.mark.parametrize("plugins, why", [
    (["kv-store", "prefix-cache"], "plugins 'kv-store' and 'prefix-cache' contradict each other"),
    (["kv-store", "no-cache"], "plugins 'kv-store' and 'no-cache' contradict each other"),
    (["prefix-cache", "swa-replay", "kv-store"], "plugins 'kv-store' and 'prefix-cache' contradict each other"),
])
def test_kv_store_replaces_prefix_cache_and_is_refused_beside_it(plugins, why):
    from deepinfer.core.config import EngineConfig
    from deepinfer.plugins.selection import select

    with pytest.raises(PluginError, match=why):
        select(EngineConfig(plugins=plugins))


@pytest.mark.slow
def test_a_host_tier_smaller_than_a_prompt_still_finishes_with_the_same_text(model_dir, ref, tmp_path):
    prompt = list(range(10, 50))  # 9 blocks before the last token; the host tier holds 2
    want = _run(ref, [prompt])
    first = _llm(model_dir, str(tmp_path))
    assert _run(first, [prompt]) == want
    _stop(first)
    opts = {"kv-store": {"directory": str(tmp_path), "fsync": False, "host_bytes": 2 * 2048}}
    second = LLM(model_dir, dtype="float32", block_size=4, plugins=["kv-store"], plugin_options=opts, progress=False)
    assert second.engine.kv.policies[0].ctx.kv_blocks.bytes_per_block == 2048
    assert _run(second, [prompt]) == want  # prefetched once, evicted by its own blocks: computed instead
    assert second.get_metrics()["deepinfer:kv_store_host_evictions"] > 0
    _stop(second)
