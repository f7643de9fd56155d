"""H200: the first token with and without prefill graphs (Llama-3.2-1B shape, bf16, batch 1):
engine start-up seconds and memory (and without any graphs), then for prompts of several lengths the median wall time of a generate
of one token (the prefill step, its LM head and sampling) over 7 runs, each engine in turn.

    python3 benchmarks/h200_prefill_graphs.py [--model llama-1b]"""
import argparse
import statistics
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="llama-1b")
args = ap.parse_args()
model = build_random_model(args.model, "bfloat16", "cuda")
engines = {}
for name, extra in (("prefill graphs", {}), ("none", {"cuda_graph_prefill_sizes": []}),
                    ("no graphs at all", {"enforce_eager": True})):
    torch.cuda.synchronize()
    t, mem = time.perf_counter(), torch.cuda.memory_reserved()
    llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False, **extra)
    print(f"{name}: engine built in {time.perf_counter() - t:.2f} s, "
          f"{(torch.cuda.memory_reserved() - mem) / 2**20:,.0f} MiB more reserved", flush=True)
    if not extra.get("enforce_eager"):
        engines[name] = llm
    else:
        del llm
one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
print("prompt tokens | " + " | ".join(f"{n} (ms)" for n in engines) + " | tokens equal")
for n in (32, 100, 256, 512, 700, 1024, 2048):
    prompt = [{"prompt_token_ids": [(7 * j + n) % 1000 + 10 for j in range(n)]}]
    times = {name: [] for name in engines}
    toks = {}
    for r in range(9):
        for name, llm in (engines.items() if r % 2 == 0 else reversed(engines.items())):
            torch.cuda.synchronize()
            t = time.perf_counter()
            o = llm.generate(prompt, one, use_tqdm=False)
            if r >= 2:  # two warm-ups
                times[name].append(time.perf_counter() - t)
            toks[name] = o[0].outputs[0].token_ids
    same = len({tuple(t) for t in toks.values()}) == 1
    print(f"{n} | " + " | ".join(f"{1000 * statistics.median(v):.2f}" for v in times.values()) + f" | {same}",
          flush=True)
