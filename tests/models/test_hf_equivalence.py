"""Greedy tokens and prompt logprobs equal transformers' on tiny random models (the oracle)."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from tests.tiny_models import hf_greedy, make_model

QWEN3_HYBRID = {"num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 24, "max_window_layers": 0,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}
CASES = {
    "llama": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2": ("qwen2", {}),
    "qwen3-hybrid": ("qwen3", QWEN3_HYBRID),
    "qwen3-window-not-block-multiple": ("qwen3", {**QWEN3_HYBRID, "sliding_window": 21}),
    "mistral-window": ("mistral", {"sliding_window": 20}),
}
PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170))]  # windows are shorter than the last two


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    model = make_model(path, arch, **overrides)
    llm = LLM(str(path), dtype="float32", block_size=8, progress=False)
    return request.param, model, llm


def test_greedy_64_tokens_equal_transformers(case):
    _, model, llm = case
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, 64)
        assert out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("rows,n", [(512, 1), (7, 2)])
def test_prompt_logprobs_match_transformers_within_1e_4(case, monkeypatch, rows, n):
    """Also with the prompt's positions taken a few at a time (rows) and two samples a prompt, of
    which only the first computes the prompt's logprobs."""
    _, model, llm = case
    runner = llm.engine.runner
    monkeypatch.setattr(runner, "PROMPT_LOGPROBS_ROWS", rows)
    computed: list[str] = []
    compute = runner._prompt_logprobs
    monkeypatch.setattr(runner, "_prompt_logprobs", lambda h, r, k: computed.append(r.request_id) or compute(h, r, k))
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=5, n=n)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert computed and all(rid.endswith("#0") for rid in computed) if n > 1 else computed
    for prompt, out in zip(PROMPTS, outs, strict=True):
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            entry = out.prompt_logprobs[i]
            assert len(entry) >= 5 and prompt[i] in entry
            for tok, lp in entry.items():
                assert abs(lp - ref[i - 1, tok].item()) < 1e-4, (i, tok)
                # its rank in the vocabulary: the tokens at or above it, itself included (near-ties
                # within 1e-4 either way)
                above = ref[i - 1] - ref[i - 1, tok]
                assert 1 + (above > 1e-4).sum() <= entry.rank_of(tok) <= (above > -1e-4).sum(), (i, tok)
            assert entry.rank is not None and (entry.rank == entry.rank_of(prompt[i]) or prompt[i] in entry.top)


def test_sliding_window_changes_the_oracle(tmp_path):
    """Guards the hybrid cases above: the window really changes logits at these prompt lengths."""
    windowed = make_model(tmp_path / "w", "qwen3", with_tokenizer=False, **QWEN3_HYBRID)
    full = make_model(tmp_path / "f", "qwen3", with_tokenizer=False,
                      **{**QWEN3_HYBRID, "layer_types": ["full_attention"] * 4})
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        assert not torch.allclose(windowed(ids).logits, full(ids).logits, atol=1e-4)


def test_bfloat16_prompt_logprobs_within_bf16_tolerance(tmp_path):
    model = make_model(tmp_path, "llama", dtype=torch.bfloat16)
    llm = LLM(str(tmp_path), progress=False)  # dtype auto: bfloat16 from config.json
    assert llm.engine.runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    prompt = PROMPTS[1]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    errs = [abs(out.prompt_logprobs[i][prompt[i]] - ref[i - 1, prompt[i]].item()) for i in range(1, len(prompt))]
    assert max(errs) < 5e-2
