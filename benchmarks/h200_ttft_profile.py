"""H200: what the first token of a batch-1 request costs (the latency workload's 512-token prompt,
Llama-3.2-1B shape, bf16): the device time of the prefill step (torch profiler, kernels grouped by
name) and the host's functions (cProfile), over a generate of one token. Writes $OUT/ttft_*.txt."""
import os
import time

import torch
from host_profile import profiled
from torch.profiler import ProfilerActivity, profile

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
model = build_random_model("llama-1b", "bfloat16", "cuda")
llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False)
prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def run():
    return llm.generate(prompt, one, use_tqdm=False)


for _ in range(3):
    run()
times = []
for _ in range(5):
    torch.cuda.synchronize()
    t = time.perf_counter()
    o = run()
    times.append(time.perf_counter() - t)
m = o[0].metrics
lines = [(f"generate of 1 token: {', '.join(f'{1000 * x:.1f}' for x in times)} ms; last TTFT "
         f"{1000 * (m['first_token_time'] - m['arrival_time']):.1f} ms")]
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    run()
    torch.cuda.synchronize()
lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))
with open(f"{out}/ttft_device.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
print(lines[0], flush=True)
with open(f"{out}/ttft_host.txt", "w") as f:
    f.write(profiled(run, 40, ("tottime", "cumulative")))
