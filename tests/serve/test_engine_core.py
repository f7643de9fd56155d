"""The engine process's side of the pipe: what each step's deltas carry, and when."""
from __future__ import annotations

from deepinfer.core.sampling_params import SamplingParams


def test_engine_core_holds_a_requests_tokens_until_its_prompt_logprobs_are_whole():
    """n = 2 and a 3-token prompt: sequence 1 samples while sequence 0 (whose prompt logprobs the
    request reports) is still in its prefill. Nothing goes out until they are whole; then one delta
    carries them and every token held back, so each choice's first chunk can echo them."""
    from types import SimpleNamespace

    from deepinfer.core.request import CompletionOutput, RequestOutput
    from deepinfer.serve.engine_core import EngineCore

    partial, whole = [None, {5: -1.0}], [None, {5: -1.0}, {6: -2.0}]
    steps = [
        RequestOutput("r", None, [4, 5, 6], [CompletionOutput(0, "", []), CompletionOutput(1, "a", [7])],
                      prompt_logprobs=partial),
        RequestOutput("r", None, [4, 5, 6], [CompletionOutput(0, "b", [8]), CompletionOutput(1, "ac", [7, 9])],
                      prompt_logprobs=whole),
        RequestOutput("r", None, [4, 5, 6], [CompletionOutput(0, "bd", [8, 10], "length"),
                                             CompletionOutput(1, "ac", [7, 9], "length")],
                      finished=True, prompt_logprobs=whole),
    ]
    engine = SimpleNamespace(step=lambda: [steps.pop(0)], add_request=lambda *a, **k: None,
                             metrics=SimpleNamespace(drain_histograms=dict))
    sent = []
    core = EngineCore(engine, SimpleNamespace(send=sent.append))
    core.handle([("add", "r", [4, 5, 6], SamplingParams(n=2, prompt_logprobs=0), None)])
    core.step()
    assert sent == []
    core.step()
    [(kind, [delta])] = sent
    assert kind == "out" and delta.prompt_logprobs == whole
    assert [(s.index, s.token_ids, s.text) for s in delta.seqs] == [(0, [8], "b"), (1, [7, 9], "ac")]
    core.step()
    last = sent[-1][1][0]
    assert last.finished and last.prompt_logprobs is None and [s.token_ids for s in last.seqs] == [[10], []]
