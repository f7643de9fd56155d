"""H200: where the nano-vllm throughput workload's time goes (Qwen3-0.6B shape, bf16, 256 requests).

    python3 benchmarks/h200_throughput_profile.py [PLUGIN_OPTIONS_JSON]

Runs the workload three times (printing each run's seconds and how many steps were decode-only),
then once more under the torch profiler and writes the kernels by total device time to
$OUT/tprof.txt."""
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from deepinfer import LLM, SamplingParams
from deepinfer.bench import workloads
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
opts = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
model = build_random_model("qwen3-0.6b", "bfloat16", "cuda")
llm = LLM(model, device="sm90", dtype="bfloat16", progress=False, plugin_options=opts)
wl = workloads.uniform(256, 100, 1024, llm.engine.ctx.model_config["vocab_size"])
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.output_lens]
prompts = [{"prompt_token_ids": p} for p in wl.prompts]
llm.generate(prompts[:2], params[:2], use_tqdm=False)
for i in range(3):
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(f"run {i}: {dt:.3f} s, {sum(wl.output_lens) / dt:.1f} output tok/s", flush=True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
with open(f"{out}/tprof.txt", "w") as f:
    f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))
print("profile written", flush=True)
