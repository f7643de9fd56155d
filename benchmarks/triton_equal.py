"""On a GPU: the `triton` attention backend against the `torch` one at real shapes.

float32: greedy tokens must be equal; bfloat16: prompt logprobs must agree within bf16 tolerance.
Then batch-1 decode (every step a single token: the device's GEMV kernels) against plain torch
layers (the `torch` backend, no fused kernels): float32 greedy tokens equal, bfloat16 logprobs of
the greedy tokens close. Writes a markdown table to the path given as the first argument; a second
argument picks the shapes (comma-separated; default llama-1b,qwen3-0.6b).
"""
from __future__ import annotations

import gc
import sys

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

PLAIN = {"sm90": {"fused_kernels": False}}


def run(model_dir: str, backend: str, dtype: str, prompts, params, options=None):
    llm = LLM(model_dir, device="sm90", plugins=[backend], dtype=dtype, progress=False, max_model_len=4096,
              plugin_options=options or {})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outs


def main(out_path: str, shapes=("llama-1b", "qwen3-0.6b")) -> int:
    g = torch.Generator().manual_seed(0)
    lines = ["| shape | dtype | check | result |", "| --- | --- | --- | --- |"]
    ok = True
    for shape in shapes:
        for dtype in ("float32", "bfloat16"):
            model_dir = build_random_model(shape, dtype, "cuda")
            vocab = 128256 if shape == "llama-1b" else 151936
            prompts = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in (7, 300, 1000, 40)]
            if dtype == "float32":
                params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
                a = [o.outputs[0].token_ids for o in run(model_dir, "torch", dtype, prompts, params)]
                b = [o.outputs[0].token_ids for o in run(model_dir, "triton", dtype, prompts, params)]
                same = a == b
                ok &= same
                lines.append(f"| {shape} | {dtype} | greedy 32 tokens x 4 prompts equal | {same} |")
            else:
                params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
                a = run(model_dir, "torch", dtype, prompts, params)
                b = run(model_dir, "triton", dtype, prompts, params)
                err = max(abs(next(iter(x.values())) - next(iter(y.values())))
                          for oa, ob in zip(a, b) for x, y in zip(oa.prompt_logprobs[1:], ob.prompt_logprobs[1:]))
                good = err < 0.1
                ok &= good
                lines.append(f"| {shape} | {dtype} | max prompt-logprob difference | {err:.4f} ({'ok' if good else 'too large'}) |")
            print(lines[-1], flush=True)
            # batch 1: the GEMV path (defaults) against plain torch layers
            one = prompts[1:2]
            params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=0)
            a = run(model_dir, "torch", dtype, one, params, PLAIN)[0].outputs[0]
            b = run(model_dir, "triton", dtype, one, params)[0].outputs[0]
            if dtype == "float32":
                same = a.token_ids == b.token_ids
                ok &= same
                lines.append(f"| {shape} | {dtype} | batch 1, GEMVs vs plain torch: greedy 32 tokens equal | {same} |")
            else:
                shared = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), 32)
                err = max(abs(a.logprobs[i][a.token_ids[i]] - b.logprobs[i][b.token_ids[i]]) for i in range(shared))
                good = err < 0.1
                ok &= good
                lines.append(f"| {shape} | {dtype} | batch 1, GEMVs vs plain torch: max logprob difference over "
                             f"the {shared} equal leading tokens of 32 | {err:.4f} ({'ok' if good else 'too large'}) |")
            print(lines[-1], flush=True)
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *([sys.argv[2].split(",")] if len(sys.argv) > 2 else [])))
