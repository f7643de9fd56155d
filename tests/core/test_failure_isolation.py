"""One request whose logits cannot be sampled (NaN, +inf: from the model or from its own parameters)
ends alone with an error; the requests batched with it finish with the tokens they get alone."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from deepinfer import LLM, SamplingParams
from deepinfer.core.sampler import Sampler
from tests.tiny_models import make_model

PROMPTS = [[5, 9, 14, 3], [7, 7, 21], [30, 4, 4, 8, 11], [12, 40]]
BAD = 1  # the request whose logits go wrong


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-isolation")
    make_model(path, "qwen3")
    return str(path)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", block_size=4, progress=False)


def _params(kind: str, seed: int) -> SamplingParams:
    kw = {"max_tokens": 12, "ignore_eos": True, "seed": seed}
    if kind == "greedy":
        return SamplingParams(temperature=0, **kw)
    if kind == "sampled":
        return SamplingParams(temperature=0.9, top_p=0.95, **kw)
    return SamplingParams(temperature=0.8, repetition_penalty=1.2, logprobs=2, **kw)  # the host path


_ALONE: dict[tuple, list[int]] = {}


def _alone(llm: LLM, prompt: list[int], params: SamplingParams) -> list[int]:
    key = (tuple(prompt), params.model_dump_json())
    if key not in _ALONE:
        _ALONE[key] = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0].token_ids
    return _ALONE[key]


def test_a_repetition_penalty_near_zero_is_refused_with_its_range():
    with pytest.raises(ValidationError, match=r"repetition_penalty"):
        SamplingParams(repetition_penalty=1e-40)
    SamplingParams(repetition_penalty=0.01)  # the bound itself is valid


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kind,poison,overlap", [
    ("sampled", NAN, True),  # on the device path, the runner marks the row (sampler.mark_unusable)
    ("penalised", INF, False),  # on the host path, the sampler does
    pytest.param("greedy", NAN, False, marks=pytest.mark.slow),
    pytest.param("greedy", INF, True, marks=pytest.mark.slow),
    pytest.param("sampled", INF, False, marks=pytest.mark.slow),
    pytest.param("penalised", NAN, False, marks=pytest.mark.slow),
])
def test_a_request_with_unusable_logits_fails_alone(llm, monkeypatch, kind, poison, overlap):
    params = [_params(kind, 100 + i) for i in range(len(PROMPTS))]
    expected = [_alone(llm, p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    engine = llm.engine
    monkeypatch.setattr(engine, "overlap", overlap)
    # from its third output token on, request BAD's row of the logits is NaN or +inf (in place, as a
    # model's NaN would be: the sampler and the runner see the same tensor)
    call, on_device = Sampler.__call__, Sampler.sample_on_device

    def poisoned(logits, requests):
        for i, r in enumerate(requests):
            if r.request_id == str(BAD) and r.num_output_tokens >= 2:
                logits[i] = poison
        return logits

    monkeypatch.setattr(Sampler, "__call__", lambda self, logits, requests: call(self, poisoned(logits, requests),
                                                                                  requests))
    monkeypatch.setattr(Sampler, "sample_on_device",
                        lambda self, logits, requests, out=None: on_device(self, poisoned(logits, requests), requests,
                                                                           out=out))
    for i, (p, sp) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(str(i), p, sp)
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
    assert set(outs) == {str(i) for i in range(len(PROMPTS))}
    bad = outs[str(BAD)].outputs[0]
    assert bad.finish_reason == "error"
    assert len(bad.token_ids) == 2 and all(t >= 0 for t in bad.token_ids)  # the tokens before the NaN
    assert bad.token_ids == expected[BAD][:2]
    for i in range(len(PROMPTS)):
        if i != BAD:
            assert outs[str(i)].outputs[0].finish_reason == "length"
            assert outs[str(i)].outputs[0].token_ids == expected[i]
    engine.kv.pool.check_all_free()
    assert engine.get_metrics()["deepinfer:request_failed"] >= 1


def test_a_repetition_penalty_past_validation_fails_its_request_alone(llm):
    """The reported case: repetition_penalty 1e-40 turned a row's positive logits into +inf; the
    next step's embedding lookup then failed every request of the batch."""
    params = [_params("sampled", 7 + i) for i in range(len(PROMPTS))]
    expected = [_alone(llm, p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    params[BAD] = params[BAD].model_copy(update={"repetition_penalty": 1e-40})  # (as if unvalidated)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert outs[BAD].outputs[0].finish_reason == "error"
    assert [o.outputs[0].token_ids for i, o in enumerate(outs) if i != BAD] == \
        [e for i, e in enumerate(expected) if i != BAD]
    llm.engine.kv.pool.check_all_free()
