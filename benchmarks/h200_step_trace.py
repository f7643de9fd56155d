"""H200: where a batch-1 decode step's device time goes, kernel by kernel, in the engine's real
path (CUDA graphs, PDL, the LM head and sampling). The torch profiler traces a few decode steps of
the Llama-3.2-1B shape (bf16, 512-token prompt); each kernel is charged the time by which it moved
the end of the device's work on (its end minus the latest end before it), so kernels that overlap
under PDL are not counted twice and idle gaps land on the kernel after them. Writes
$OUT/step_trace.txt.

    python3 benchmarks/h200_step_trace.py [llama-1b] [--tokens 24] [--copies] [--variants JSON ...]

(--copies: memory copies and sets are charged as kernels are, under their own names.)

(--variants: plugin options for each traced engine, e.g. '{}' '{"triton": {"split_size": 512}}'; last.)

(--tiles FILE: the single-token GEMV tiles of FILE, as h200_latency_with.py takes them.)
"""
import json
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
shape = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "llama-1b"
tokens = int(sys.argv[sys.argv.index("--tokens") + 1]) if "--tokens" in sys.argv else 24
model = build_random_model(shape, "bfloat16", "cuda")
KINDS = ("kernel", "gpu_memcpy", "gpu_memset") if "--copies" in sys.argv else ("kernel",)
if "--tiles" in sys.argv:
    from gemv_tiles_patch import use_tiles
    use_tiles(sys.argv[sys.argv.index("--tiles") + 1])
variants = [json.loads(v) for v in sys.argv[sys.argv.index("--variants") + 1:]] if "--variants" in sys.argv else [{}]


def trace(plugin_options):
    """Per kernel name: (launches a step, us a step charged); the device time of a step; steps."""
    llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False,
              plugin_options=plugin_options)
    prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompt, sp, use_tqdm=False)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        llm.generate(prompt, sp, use_tqdm=False)
        torch.cuda.synchronize()
    del llm
    torch.cuda.empty_cache()
    path = f"{out}/trace.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") in KINDS and e.get("ph") == "X"]
    os.remove(path)
    events.sort(key=lambda e: e["ts"])
    # decode steps end at the argmax; the prefill's and the first decode step's are left out
    step_ends = [i for i, e in enumerate(events) if "argmax" in e["name"]]
    if len(step_ends) < 4:
        sys.exit(f"found {len(step_ends)} argmax kernels; cannot cut steps")
    first, last = step_ends[1] + 1, step_ends[-1]
    steps = len(step_ends) - 2
    charge: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    end = start = events[first - 1]["ts"] + events[first - 1]["dur"]
    for e in events[first:last + 1]:
        e_end = e["ts"] + e["dur"]
        charge[e["name"][:70]] += max(0.0, e_end - end)
        count[e["name"][:70]] += 1
        end = max(end, e_end)
    return {k: (count[k] / steps, charge[k] / steps) for k in charge}, (end - start) / steps, steps


lines = []
for opts in variants:
    per, step, steps = trace(opts)
    lines += [(f"{shape} batch 1, plugin options {json.dumps(opts)}: {steps} decode steps traced, {step:.1f} us a "
              "step on the device (end of one step's argmax to the next's; gaps where the device waited for the "
              "host are charged to the kernel after them)"),
              f"  {'kernel':70s} {'a step':>7s} {'us a step':>10s} {'us each':>8s}"]
    for key, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {key:70s} {n:7.1f} {t:10.1f} {t / n:8.2f}")
    print("\n".join(lines[-len(per) - 2:]), flush=True)
with open(f"{out}/step_trace.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
