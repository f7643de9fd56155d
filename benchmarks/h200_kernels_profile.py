"""H200: the device time of one decode step, kernel by kernel (torch profiler over eager steps), and
the time of a bare graph replay, for the Llama-3.2-1B shape in bf16. Writes $OUT/kprof_*.txt."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
shape = sys.argv[1] if len(sys.argv) > 1 else "llama-1b"
model = build_random_model(shape, "bfloat16", "cuda")
for eager in (True, False):
    llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False, enforce_eager=eager,
              max_num_seqs=64)
    for batch in (1, 64):
        prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(512)]} for i in range(batch)]
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        llm.generate(prompts, sp, use_tqdm=False)
        if eager:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                llm.generate(prompts, sp, use_tqdm=False)
                torch.cuda.synchronize()
            with open(f"{out}/kprof_{shape}_b{batch}.txt", "w") as f:
                f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
        else:
            replay = llm.engine.runner.graphs._replays[batch][0]
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(5):
                replay()
            s.record()
            for _ in range(100):
                replay()
            e.record()
            torch.cuda.synchronize()
            print(f"{shape} batch {batch}: bare graph replay {s.elapsed_time(e) / 100:.3f} ms (KV of the last "
                  "step's lengths)")
    del llm
    torch.cuda.empty_cache()
