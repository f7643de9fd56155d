"""H200: where a batch-1 decode step's device time goes, kernel by kernel, in the engine's real
path (CUDA graphs, PDL, the LM head and sampling). The torch profiler traces a few decode steps of
the Llama-3.2-1B shape (bf16, 512-token prompt); each kernel is charged the time by which it moved
the end of the device's work on (its end minus the latest end before it), so kernels that overlap
under PDL are not counted twice and idle gaps land on the kernel after them. Writes
$OUT/step_trace.txt.

    python3 benchmarks/h200_step_trace.py [llama-1b] [--tokens 24]
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
llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False)
prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.generate(prompt, sp, use_tqdm=False)
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    llm.generate(prompt, sp, use_tqdm=False)
    torch.cuda.synchronize()
path = f"{out}/trace.json"
prof.export_chrome_trace(path)
with open(path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
os.remove(path)
events.sort(key=lambda e: e["ts"])
# the decode steps: from the first kernel after the prefill's last one; a step ends at the argmax
names = [e["name"] for e in events]
step_ends = [i for i, n in enumerate(names) if "argmax" in n]
if len(step_ends) < 4:
    sys.exit(f"found {len(step_ends)} argmax kernels; cannot cut steps: {sorted(set(names))[:20]}")
first, last = step_ends[1] + 1, step_ends[-1]  # whole steps after the first decode step
steps = len(step_ends) - 2
charge: dict[str, float] = defaultdict(float)
count: dict[str, int] = defaultdict(int)
end = events[first - 1]["ts"] + events[first - 1]["dur"]
busy_end = end
for e in events[first:last + 1]:
    e_end = e["ts"] + e["dur"]
    key = e["name"][:70]
    charge[key] += max(0.0, e_end - end)
    count[key] += 1
    end = max(end, e_end)
total = end - busy_end
lines = [(f"{shape} batch 1, {steps} decode steps traced: {total / steps:.1f} us a step on the device "
          "(from the end of one step's argmax to the next's)"),
         f"{'kernel':70s} {'a step':>7s} {'us a step':>10s} {'us each':>8s}"]
for key, t in sorted(charge.items(), key=lambda kv: -kv[1]):
    lines.append(f"{key:70s} {count[key] / steps:7.1f} {t / steps:10.1f} {t / count[key]:8.2f}")
with open(f"{out}/step_trace.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
