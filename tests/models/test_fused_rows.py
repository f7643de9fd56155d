"""Steps of a few tokens routed through the multi-row GEMVs (as CUDA devices run verifications and
small decode batches) give the plain-torch outputs.

Runs the kernels in the Triton interpreter on CPU, in a child process, float32, with the device's
own FusedOps (which say which steps they take); heads of 32, the narrowest the rows' rotary tile
takes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interpreter import run_interpreted
from tests.tiny_models import hybrid, make_model

pytestmark = pytest.mark.slow  # whole engines in the Triton interpreter, in subprocesses

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
from deepinfer_kernels import FusedOps
from deepinfer import LLM, SamplingParams
from tests.counting_ops import CountingOps, by_name
rows_module = sys.modules["deepinfer_kernels.gemv_rows"]  # (the package's name gemv_rows is the function)
path, plugins, max_rows, max_weights = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if max_weights:
    rows_module.ROWS_MAX_WEIGHTS = max_weights
# a 5-token prefill (two prompts) and decode steps of two tokens: all a few rows
prompts = [{"prompt_token_ids": p} for p in ([5, 6, 7], [9, 10])]
params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=0)
out = {}
ops = CountingOps(FusedOps(gemv_rows=max_rows), only=("gemv", "gemv_qkv_rotary"),
                 key=lambda name, args, kwargs: by_name(name, args, kwargs) + f" x{args[0].shape[0]}")
for fused in (False, True):
    llm = LLM(path, dtype="float32", block_size=4, progress=False, plugins=plugins)
    if fused:  # as the builder wires a device's fused ops
        llm.engine.runner.model.use_fused_ops(ops)
        llm.engine.runner.sampler.argmax = ops.argmax
    res = llm.generate(prompts, params, use_tqdm=False)
    out[str(fused)] = [[o.outputs[0].token_ids, [list(lp.values())[0] for lp in o.prompt_logprobs[1:]]]
                       for o in res]
out["calls"] = ops.calls
out["most_weights"] = llm.engine.runner.model.model.layers[0].most_weights
print(json.dumps(out))
"""


def _run(path, plugins, max_rows=16, max_weights=0):
    res = run_interpreted(["-c", CHILD, str(path), json.dumps(plugins), str(max_rows), str(max_weights)])
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch,plugins", [("llama", []), ("qwen3", ["triton"])])
def test_steps_of_a_few_tokens_match_plain_layers(tmp_path, arch, plugins):
    """Llama with the torch backend (it writes the cache itself), and a hybrid sliding-window Qwen3
    with the q/k norm and the triton backend (the qkv GEMV writes every token's key and value)."""
    extra = {**hybrid(6), "head_dim": 32} if arch == "qwen3" else {"hidden_size": 128}
    make_model(tmp_path, arch, with_tokenizer=False, **extra)
    out = _run(tmp_path, plugins)
    layers, steps = 2, 6
    qkv = "gemv_qkv_rotary+kv_cache" if plugins else "gemv_qkv_rotary"
    # the prefill (5 tokens) and every decode step (2) run through the GEMVs, a layer's qkv and
    # three more; the LM head too, of each decode step's two rows (and of the prefill's rows it
    # computes, a few at a time)
    calls = out["calls"]
    assert calls[f"{qkv} x5"] == layers and calls["gemv x5"] == 3 * layers
    assert calls[f"{qkv} x2"] == layers * (steps - 1) and calls["gemv x2"] >= (3 * layers + 1) * (steps - 1)
    assert not any(k.startswith("gemv_qkv_rotary") and k.split()[0] != qkv for k in calls)
    for (tokens, lps), (tokens_f, lps_f) in zip(out["False"], out["True"], strict=True):
        assert tokens == tokens_f
        assert max((abs(a - b) for a, b in zip(lps, lps_f, strict=True)), default=0.0) < 1e-4


def test_more_tokens_or_larger_projections_than_the_rows_keep_the_matmuls(tmp_path):
    """With gemv_rows 4, the 5-token prefill runs the plain layers; the 2-token steps the GEMVs.
    Then with ``ROWS_MAX_WEIGHTS`` lowered to one below this model's largest projection (its
    gate/up), the 2-token steps run the plain layers too."""
    make_model(tmp_path, "llama", with_tokenizer=False, hidden_size=128)
    out = _run(tmp_path, [], max_rows=4)
    assert not any(" x5" in k for k in out["calls"]) and out["calls"]["gemv_qkv_rotary x2"] == 2 * 5
    assert out["False"][0][0] == out["True"][0][0] and out["False"][1][0] == out["True"][1][0]
    limit = out["most_weights"] - 1
    out = _run(tmp_path, [], max_rows=4, max_weights=limit)
    assert not any(k.startswith("gemv_qkv_rotary") for k in out["calls"])
    assert out["False"][0][0] == out["True"][0][0] and out["False"][1][0] == out["True"][1][0]
