"""H200: where a batch-1 and a batch-64 decode step spends its time (cProfile of the host). Writes $OUT/profile_*.txt. Run after benchmarks/h200_setup.sh."""
import os
import sys

import torch
from host_profile import profiled, timed

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
shape = sys.argv[1] if len(sys.argv) > 1 else "llama-1b"
attn = sys.argv[2] if len(sys.argv) > 2 else "triton"
model = build_random_model(shape, "bfloat16", "cuda")
llm = LLM(model, device="sm90", dtype="bfloat16", plugins=[attn], kv_cache_memory_gb=20, max_num_seqs=256,
          progress=False)
for batch in (1, 64):
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(512)]} for i in range(batch)]
    sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    def run(prompts=prompts, sp=sp):
        llm.generate(prompts, sp, use_tqdm=False)

    run()
    wall = timed(run, torch.cuda.synchronize)
    report = profiled(run, 35)
    with open(f"{out}/profile_{shape}_{attn}_b{batch}.txt", "w") as f:
        f.write(f"{shape} {attn} batch {batch}: 128 tokens in {wall:.3f} s = {batch * 128 / wall:.1f} tok/s, "
                f"{1000 * wall / 128:.2f} ms/step\n")
        f.write(report)
    print(f"{shape} {attn} batch {batch}: {1000 * wall / 128:.2f} ms/step, {batch * 128 / wall:.1f} tok/s")
