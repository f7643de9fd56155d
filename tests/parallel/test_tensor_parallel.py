"""Two tensor-parallel ranks (gloo, on the CPU) give the single-process engine's tokens (the oracle)."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from tests.tiny_models import make_model

#: llama: one KV head for two ranks (replicated) and a vocabulary that does not split evenly (a
#: padded shard); qwen3: two KV heads split, q/k norms, tied embeddings (a vocab-parallel LM head);
#: deepseek_v3: latent attention (heads split, the latent replicated), routed and shared experts
#: with their width split, a dense first layer
CASES = {"llama": ("llama", {"num_key_value_heads": 1, "vocab_size": 321}),
         "qwen3": ("qwen3", {"tie_word_embeddings": True}),
         "deepseek_v3": ("deepseek_v3", {"n_group": 2, "topk_group": 1, "vocab_size": 321})}
PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170))]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def engines(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    path = str(tmp_path_factory.mktemp(request.param))
    make_model(path, arch, **overrides)
    one = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False)
    two = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False, tensor_parallel_size=2)
    yield one, two
    two.shutdown()
    one.shutdown()


def _generate(llm: LLM, params: SamplingParams):
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)


@pytest.mark.slow
def test_greedy_tokens_equal_the_single_process_engine(engines):
    one, two = engines
    want = [o.outputs[0].token_ids for o in _generate(one, GREEDY)]
    assert [o.outputs[0].token_ids for o in _generate(two, GREEDY)] == want


@pytest.mark.slow
def test_greedy_tokens_equal_with_overlap_scheduling(engines, monkeypatch):
    """Overlap feeds each step's samples, still on rank 0's device, into the next step: they are
    broadcast with the step's inputs (the CPU does not overlap by default; the test turns it on)."""
    one, two = engines
    want = [o.outputs[0].token_ids for o in _generate(one, GREEDY)]
    driver = two.engine.runner.ranks
    placeholders = []
    send = driver.send_step
    monkeypatch.setattr(driver, "send_step", lambda seqs, sliding, prev: placeholders.append(prev is not None)
                        or send(seqs, sliding, prev))
    monkeypatch.setattr(two.engine, "overlap", True)
    assert [o.outputs[0].token_ids for o in _generate(two, GREEDY)] == want
    assert any(placeholders)  # (steps did take their tokens from the step left running)


@pytest.mark.slow
def test_prompt_logprobs_equal_the_single_process_engine_within_1e_5(engines, monkeypatch):
    """Prompt logprobs take several logits calls a step (7 positions at a time): each is mirrored
    by the other rank, which computes its half of the vocabulary."""
    one, two = engines
    monkeypatch.setattr(two.engine.runner, "PROMPT_LOGPROBS_ROWS", 7)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=3)
    for a, b in zip(_generate(one, params), _generate(two, params), strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for want, got in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert want.keys() == got.keys()
            assert torch.allclose(torch.tensor(list(want.values())), torch.tensor([got[k] for k in want]),
                                  atol=1e-5)

