"""Batching must not change results: one at a time == together under chunked prefill and preemption."""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from tests.tiny_models import hybrid, make_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_model(path, "qwen3", **hybrid(12))
    return str(path)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(6, 320) for _ in range(rng.randrange(3, 60))] for _ in range(n)]


@pytest.mark.slow
def test_batched_with_chunked_prefill_and_preemption_equals_one_at_a_time(model_dir):
    prompts = _prompts(12)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    expected = [alone.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].outputs[0].token_ids
                for p in prompts]
    # 23 blocks of 4 tokens: one request fits (max_model_len 88) but twelve do not -> preemption;
    # a 16-token budget splits every longer prompt into chunks
    tight = LLM(model_dir, dtype="float32", block_size=4, num_kv_blocks=23, max_model_len=88,
                max_num_batched_tokens=16, progress=False)
    outs = tight.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    metrics = tight.get_metrics()
    assert metrics["deepinfer:num_preemptions"] > 0
    assert metrics["deepinfer:prompt_tokens"] == sum(len(p) for p in prompts)
    tight.engine.kv.pool.check_all_free()
    assert tight.engine.kv.pool.num_free_blocks == 23
    alone.engine.kv.pool.check_all_free()



@pytest.mark.slow
def test_prompt_logprobs_under_chunked_prefill_and_preemption_equal_one_at_a_time(model_dir):
    """A request preempted (during or after its prefill) computes its prompt again: its prompt
    logprobs are still one entry a prompt token (None for the first), as alone."""
    prompts = _prompts(8, seed=2)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, prompt_logprobs=2)
    alone = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    expected = [alone.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].prompt_logprobs for p in prompts]
    tight = LLM(model_dir, dtype="float32", block_size=4, num_kv_blocks=20, max_model_len=76,
                max_num_batched_tokens=16, progress=False)
    outs = tight.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert tight.get_metrics()["deepinfer:num_preemptions"] > 0
    for out, want, prompt in zip(outs, expected, prompts, strict=True):
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        for got_pos, want_pos in zip(out.prompt_logprobs[1:], want[1:], strict=True):
            assert got_pos.keys() == want_pos.keys()
            assert list(got_pos.values()) == pytest.approx(list(want_pos.values()), abs=1e-4)
    tight.engine.kv.pool.check_all_free()

def test_seeded_sampling_is_the_same_alone_and_batched(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    prompts = _prompts(6, seed=1)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": prompts[0]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    batch = llm.generate([{"prompt_token_ids": p} for p in prompts],
                         [seeded] + [others] * 5, use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone
    # a different seed gives a different sequence (the seed is really used)
    other_seed = seeded.model_copy(update={"seed": 99})
    assert llm.generate({"prompt_token_ids": prompts[0]}, other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone
    llm.engine.kv.pool.check_all_free()


def test_n_sequences_and_abort_free_every_block(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    out = llm.generate({"prompt_token_ids": [7, 8, 9]}, SamplingParams(n=3, temperature=1.0, seed=5,
                                                                       max_tokens=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs) == 3 and all(len(c.token_ids) == 8 for c in out.outputs)
    eng = llm.engine
    eng.add_request("a", [5] * 30, SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    assert eng.kv.pool.num_free_blocks < eng.kv.pool.num_blocks
    assert eng.abort_request("a") and not eng.has_unfinished_requests()
    eng.kv.pool.check_all_free()


def test_step_reports_every_change_when_streaming_and_only_finished_otherwise(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    eng = llm.engine
    assert eng.emit_unfinished is False  # LLM.generate needs whole outputs only
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for streaming in (True, False):
        eng.emit_unfinished = streaming
        eng.add_request(f"s{streaming}", [7, 8, 9], params)
        seen = []
        while eng.has_unfinished_requests():
            seen += [(len(o.outputs[0].token_ids), o.finished) for o in eng.step()]
        assert seen == ([(i, i == 5) for i in range(1, 6)] if streaming else [(5, True)])


def test_requests_with_penalties_or_before_min_tokens_decode_without_drafts(model_dir):
    """The engine offers the drafter only the decoding sequences that may speculate: never one
    with penalties, one with min_tokens only once it has that many output tokens."""
    llm = LLM(model_dir, dtype="float32", block_size=4, plugins=["ngram"], progress=False)
    eng = llm.engine
    kinds = {"plain": SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
             "penalised": SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=0.5),
             "min4": SamplingParams(temperature=0, max_tokens=12, min_tokens=4, ignore_eos=True)}
    for name, params in kinds.items():
        eng.add_request(name, [9, 10, 11, 9, 10, 11, 9, 10], params)
    offered = []
    while eng.has_unfinished_requests():
        decoding = {r.request_id: r.num_output_tokens for r in eng.table.decoding()}
        offered.append(decoding)
        eng.step()
    outputs = [n for step in offered for rid, n in step.items() if rid == "min4"]
    assert outputs and min(outputs) == 4  # from its fourth output token on, not before
    assert all("penalised" not in step for step in offered)
    assert any("plain" in step and step["plain"] < 4 for step in offered)
