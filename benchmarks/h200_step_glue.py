"""H200: what a batch-1 decode step's inputs cost (Llama-3.2-1B shape, bf16, 512-token prompt, 256
new tokens). Decode tok/s after the first token, interleaved run by run, for the engine as it is
and with each step's host-to-device copy of its inputs skipped (the graph then replays on the
previous step's inputs: wrong tokens, the same device work, so only its time is read). Median of
5 runs each. (Ran in session 15 before inputs were staged: a staged size's replay reads its
inputs itself, so at batch 1 both variants are now the same.)

    python3 benchmarks/h200_step_glue.py"""
import statistics
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model
from deepinfer.core import graphs

model = build_random_model("llama-1b", "bfloat16", "cuda")
llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False)
prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
params = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
upload = graphs.PackedInputs.upload


def skipped(self, turn, b):
    if b != 1:
        upload(self, turn, b)


rates = {"as is": [], "no input copy": []}
for r in range(7):
    for name in (rates if r % 2 == 0 else reversed(list(rates))):
        graphs.PackedInputs.upload = skipped if name == "no input copy" else upload
        torch.cuda.synchronize()
        o = llm.generate(prompt, params, use_tqdm=False)[0]
        end = time.monotonic()
        if r >= 2:
            rates[name].append(255 / (end - o.metrics["first_token_time"]))
graphs.PackedInputs.upload = upload
for name, v in rates.items():
    med = statistics.median(v)
    print(f"{name}: {med:,.1f} tok/s after the first token ({1e6 / med:.1f} us a step); runs "
          + ", ".join(f"{x:,.0f}" for x in v), flush=True)
