"""H200: a module flag of deepinfer_kernels._launch that only changes scheduling (EARLY_TRIGGER)
must give the same bits: batch-1 greedy decode of the Llama-3.2-1B shape (bf16, CUDA graphs, the
single-token GEMVs and decode attention launched with PDL) with the flag off and on; the tokens
and every logprob must be equal.

    python3 benchmarks/h200_flag_equal.py EARLY_TRIGGER
"""
import sys

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model
from deepinfer_kernels import _launch

flag = sys.argv[1]
model = build_random_model("llama-1b", "bfloat16", "cuda")
llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False)
prompts = [{"prompt_token_ids": [(7 * j + 3 * i) % 1000 + 10 for j in range(300 + 50 * i)]} for i in range(3)]
sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=1)


def run():
    outs = [llm.generate([p], sp, use_tqdm=False)[0].outputs[0] for p in prompts]  # batch 1 each
    return [(list(o.token_ids), o.logprobs) for o in outs]


setattr(_launch, flag, False)
off = run()
setattr(_launch, flag, True)
on = run()
same = off == on
print(f"{flag}: batch-1 tokens and logprobs over {len(prompts)} prompts x 48 tokens, off vs on: "
      f"{'identical' if same else 'DIFFERENT'}")
sys.exit(0 if same else 1)
