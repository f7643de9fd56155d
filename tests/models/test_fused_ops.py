"""Models routed through the fused Triton kernels (as CUDA devices do) give the plain-torch outputs.

Runs the kernels in the Triton interpreter on CPU, in a child process (the interpreter is chosen
when triton is first imported), float32.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interpreter import run_interpreted
from tests.tiny_models import hybrid, make_model

pytestmark = pytest.mark.slow  # whole engines in the Triton interpreter, in subprocesses

ROOT = Path(__file__).resolve().parents[2]
#: tokens each request makes: the prompt's step and three decode steps (each kernel's every path)
STEPS = 4

CHILD = """
import json, sys
import deepinfer_kernels
from deepinfer import LLM, SamplingParams
from tests.counting_ops import CountingOps
path, STEPS = sys.argv[1], int(sys.argv[2])
batch = [{"prompt_token_ids": p} for p in ([5, 6, 7], list(range(10, 40)))]
one = [{"prompt_token_ids": [9]}]  # a one-token prompt: every step is single-token, prefill included
params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, prompt_logprobs=0)
out = {}
# "tri": the one-token prompt with the triton backend, whose cache the qkv kernel then writes
# ("trioff": with that fusion off, the backend writes k and v itself)
off = {"triton": {"single_token_fusion": False}}
for name, prompts, plugins, opts in (("batch", batch, [], {}), ("one", one, [], {}), ("tri", one, ["triton"], {}),
                                     ("trioff", one, ["triton"], off)):
    ops = CountingOps(deepinfer_kernels)
    for fused in (False, True) if not name.startswith("tri") else (True,):
        llm = LLM(path, dtype="float32", block_size=4, progress=False, plugins=plugins, plugin_options=opts)
        if fused:  # as the builder wires a device's fused ops
            llm.engine.runner.model.use_fused_ops(ops)
            llm.engine.runner.sampler.argmax = ops.argmax
        res = llm.generate(prompts, params, use_tqdm=False)
        out[name + str(fused)] = [[o.outputs[0].token_ids, [list(lp.values())[0] for lp in o.prompt_logprobs[1:]]]
                                  for o in res]
    out[name + "calls"] = ops.calls
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_fused_kernels_match_plain_layers(tmp_path, arch):
    extra = hybrid(12) if arch == "qwen3" else {}
    make_model(tmp_path, arch, with_tokenizer=False, **extra)
    res = run_interpreted(["-c", CHILD, str(tmp_path), str(STEPS)])
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # two sequences: the multi-token kernels in every step, prompts and decode alike (T >= 2)
    assert set(out["batchcalls"]) == {"rms_norm", "apply_rotary", "silu_and_mul", "argmax"}
    # one sequence from a one-token prompt: every step is single-token, so the GEMV path runs
    # (3 GEMVs a layer and one qkv GEMV a layer, every step); the LM head of one row is a GEMV too,
    # with the final norm folded in (each step's; a one-token prompt has no token for prompt logprobs
    # to score, so none for them): no separate norm kernel
    layers, steps = 2, STEPS
    heads = steps
    if arch == "qwen2":  # a qkv bias: single-token steps keep the multi-token kernels (not the LM head)
        assert set(out["onecalls"]) == {"embedding", "rms_norm", "apply_rotary", "silu_and_mul", "argmax", "gemv"}
        assert out["onecalls"]["gemv"] == heads
    else:
        assert out["onecalls"] == {"gemv_qkv_rotary": layers * steps, "gemv": 3 * layers * steps + heads,
                                   "embedding": steps, "argmax": steps}
    if arch != "qwen2":  # the triton backend lets the qkv GEMV write the cache: no separate KV write
        assert out["tricalls"] == {"gemv_qkv_rotary+kv_cache": layers * steps, "gemv": 3 * layers * steps + heads,
                                   "embedding": steps, "argmax": steps}
        assert out["trioffcalls"] == out["onecalls"]  # fusion off: the cache is the backend's to write
    for name in ("batch", "one", "tri", "trioff"):
        plain = out[("one" if name.startswith("tri") else name) + "False"]
        for (tokens, lps), (tokens_f, lps_f) in zip(plain, out[name + "True"], strict=True):
            assert tokens == tokens_f
            assert max((abs(a - b) for a, b in zip(lps, lps_f, strict=True)), default=0.0) < 1e-4
