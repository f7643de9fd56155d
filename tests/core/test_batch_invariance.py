"""``batch_invariant``: a request's tokens and logprobs are the same bits whatever it is batched
with, however its prompt is chunked, whether its prefix was cached, and with a drafter on.

Oracle: the same request run alone (``torch.equal`` on its logprobs, compared as exact floats).
The default mode is the control: the same comparisons find differing bits there, so the checks
can fail. CPU, float32 and bfloat16, dense, sliding-window and mixture-of-experts models.
"""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.plugins import PluginError
from tests.tiny_models import hybrid, make_model

MODELS = {"llama": {}, "qwen3": hybrid(12), "deepseek_v3": {"n_group": 2, "topk_group": 1}}
PARAMS = SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True)


@pytest.fixture(scope="module", params=list(MODELS))
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_model(path, request.param, with_tokenizer=False, **MODELS[request.param])
    return str(path)


def _engine(model_dir: str, invariant: bool = True, dtype: str = "float32", **kw) -> LLM:
    return LLM(model_dir, progress=False, dtype=dtype, batch_invariant=invariant, num_kv_blocks=1024, block_size=4,
               max_model_len=160, **kw)


def _prompts(n: int, seed: int, lo: int = 2, hi: int = 40) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 320) for _ in range(rng.randrange(lo, hi))]} for _ in range(n)]


def _bits(out) -> tuple:
    """A completion's tokens and every logprob it reports, as exact floats."""
    c = out.outputs[0]
    return tuple(c.token_ids), tuple(tuple(sorted(d.items())) for d in c.logprobs)


NEEDLE = _prompts(1, 99, 21, 22)[0]


def _needle_among(llm: LLM, fillers: int, seed: int) -> tuple:
    return _bits(llm.generate([NEEDLE, *_prompts(fillers, seed)], PARAMS, use_tqdm=False)[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_needles_logprobs_are_the_same_bits_alone_and_among_1_to_64_fillers(model_dir, dtype):
    llm = _engine(model_dir, dtype=dtype, max_num_seqs=65)
    alone = _needle_among(llm, 0, 0)
    for fillers in (1, 2, 5, 16, 31, 64):
        assert _needle_among(llm, fillers, fillers) == alone, fillers


def test_without_the_mode_a_needle_gets_other_bits_in_a_batch(model_dir):
    llm = _engine(model_dir, invariant=False, max_num_seqs=65)
    alone = _needle_among(llm, 0, 0)
    assert any(_needle_among(llm, n, n) != alone for n in (1, 16, 64))


def test_32_prompts_one_at_a_time_and_all_at_once(model_dir):
    prompts = _prompts(32, 7)
    one = _engine(model_dir, max_num_seqs=1).generate(prompts, PARAMS, use_tqdm=False)
    many = _engine(model_dir, max_num_seqs=32).generate(prompts, PARAMS, use_tqdm=False)
    assert [_bits(o) for o in one] == [_bits(o) for o in many]


def test_chunked_prefill_boundaries_moved_and_a_prefix_cache_hit_change_no_bit(model_dir):
    long = _prompts(3, 11, 90, 120)
    base = [_bits(o) for o in _engine(model_dir).generate(long, PARAMS, use_tqdm=False)]
    for budget in (7, 32):  # prompts cut into chunks of at most this many tokens (a step's budget)
        chunked = _engine(model_dir, max_num_batched_tokens=budget, max_num_seqs=3)
        assert [_bits(o) for o in chunked.generate(long, PARAMS, use_tqdm=False)] == base, budget
    cached = _engine(model_dir, plugins=["prefix-cache"])
    miss = [_bits(o) for o in cached.generate(long, PARAMS, use_tqdm=False)]
    hit = [_bits(o) for o in cached.generate(long, PARAMS, use_tqdm=False)]
    assert miss == hit == base
    assert cached.get_metrics()["deepinfer:prefix_cache_hits"] > 0


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_a_drafter_changes_no_bit(tmp_path, drafter):
    make_model(tmp_path, "llama", with_tokenizer=False)
    # (the draft: the target itself, so that rounds verify drafts and accept some)
    options = {"draft-model": {"model": str(tmp_path)}} if drafter == "draft-model" else {}
    prompts = _prompts(6, 3) + [{"prompt_token_ids": [5, 6, 7, 8] * 6}]
    plain = [_bits(o) for o in _engine(str(tmp_path)).generate(prompts, PARAMS, use_tqdm=False)]
    spec = _engine(str(tmp_path), plugins=[drafter], plugin_options=options)
    assert [_bits(o) for o in spec.generate(prompts, PARAMS, use_tqdm=False)] == plain
    assert spec.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"] > 0
    if drafter == "draft-model":  # (its compiled step is off by default under the mode)
        assert spec.engine.drafter.runner.draft.compiled is None


def test_a_plugin_that_cannot_run_the_mode_is_refused_with_its_reason(tmp_path, monkeypatch):
    from deepinfer_builtin.attention.torch_attn import TorchAttention
    from deepinfer_builtin.devices.cpu import CPUDevice

    make_model(tmp_path, "llama", with_tokenizer=False)
    monkeypatch.setattr(TorchAttention, "batch_invariance_unavailable", lambda self: "its sums follow the batch")
    with pytest.raises(PluginError, match=r"--batch-invariant cannot run here: attention plugin 'torch': its sums "
                                          r"follow the batch \(built in, the cpu device with the torch"):
        _engine(str(tmp_path))
    monkeypatch.setattr(CPUDevice, "batch_invariance_unavailable", lambda self: "no fixed blocking")
    with pytest.raises(PluginError, match=r"device plugin 'cpu': no fixed blocking; attention plugin 'torch'"):
        _engine(str(tmp_path))
    _engine(str(tmp_path), invariant=False)  # (the mode off: nothing asked)
