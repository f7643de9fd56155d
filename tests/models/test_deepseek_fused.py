"""DeepSeek models routed through the fused Triton kernels (as CUDA devices route them) give the
plain-torch tokens and prompt logprobs: the rotary kernel over rope rows reordered to halves, the
single-token GEMVs of the attention projections and shared experts, the grouped top-k and fused MoE.

The kernels run in the Triton interpreter on CPU, in a child process, in float32.
"""
from __future__ import annotations

import json

import pytest

from tests.interpreter import run_interpreted
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # whole engines in the Triton interpreter, in subprocesses

CHILD = """
import json, sys
import deepinfer_kernels
from deepinfer import LLM, SamplingParams
from tests.counting_ops import CountingOps
batch = [{"prompt_token_ids": p} for p in ([5, 6, 7], list(range(10, 30)))]
one = [{"prompt_token_ids": [9]}]  # a one-token prompt: every step is single-token, prefill included
params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
out = {}
for name, prompts in (("batch", batch), ("one", one)):
    ops = CountingOps(deepinfer_kernels)
    for fused in (False, True):
        llm = LLM(sys.argv[1], dtype="float32", block_size=4, progress=False)
        if fused:  # as the builder wires a device's fused ops
            llm.engine.runner.model.use_fused_ops(ops)
        res = llm.generate(prompts, params, use_tqdm=False)
        out[name + str(fused)] = [[o.outputs[0].token_ids, [list(lp.values())[0] for lp in o.prompt_logprobs[1:]]]
                                  for o in res]
    out[name + "calls"] = ops.calls
print(json.dumps(out))
"""

# V2 without q_lora_rank, V3 with it: rope over interleaved pairs (reordered to halves at load)
CASES = {"v2": ("deepseek_v2", {"q_lora_rank": None, "n_group": 1, "topk_group": 1}),
         "v3": ("deepseek_v3", {"n_group": 4, "topk_group": 2})}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernels_match_plain_layers(tmp_path, case):
    arch, extra = CASES[case]
    make_model(tmp_path, arch, with_tokenizer=False, **extra)
    res = run_interpreted(["-c", CHILD, str(tmp_path)])
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    layers, steps = 2, 4  # (tiny_models' DeepSeek: a dense first layer, then a MoE layer)
    calls = out["onecalls"]
    assert calls["apply_rotary"] == layers * steps  # one rotary kernel a layer, q and k together
    assert calls["fused_moe"] == calls["grouped_topk"] == steps
    # single-token steps: q (or q_a and q_b), kv_a and o a layer, and the shared experts' two
    gemvs_per_layer = 3 if case == "v2" else 4
    assert calls["gemv"] == layers * steps * gemvs_per_layer + 2 * steps
    assert "gemv" not in out["batchcalls"] and out["batchcalls"]["apply_rotary"] == layers * steps
    for name in ("batch", "one"):
        for (tokens, lps), (tokens_f, lps_f) in zip(out[name + "False"], out[name + "True"], strict=True):
            assert tokens == tokens_f
            assert max((abs(a - b) for a, b in zip(lps, lps_f, strict=True)), default=0.0) < 1e-4
