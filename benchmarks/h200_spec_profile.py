"""Where a speculative round's time goes on the GPU: cProfile (host) and the torch profiler
(device) over one batch-64 generate of `bench spec`'s workload, per drafter.

    python3 benchmarks/h200_spec_profile.py --out DIR [--drafters draft-model,deepspark] [--batch 64] [--top 30]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from host_profile import profiled, timed

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--drafters", default="draft-model,deepspark")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--device", default="sm90")
    ap.add_argument("--top", type=int, default=30, help="functions listed under each cProfile sort")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for drafter in a.drafters.split(","):
        llm = LLM(None, progress=False, device=a.device, plugins=[] if drafter == "none" else [drafter])
        prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), a.batch, 64)]
        params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)

        def run(llm=llm, prompts=prompts, params=params):
            llm.generate(prompts, params, use_tqdm=False)

        run()  # warm-up: compiles, captures
        plain = timed(run)
        report = profiled(run, a.top, ("tottime", "cumulative"))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as tp:
            llm.generate(prompts, params, use_tqdm=False)
        table = tp.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        text = f"{drafter} batch {a.batch}: {plain:.3f} s, {a.batch * a.output_len / plain:.1f} tok/s\n"
        print(text, flush=True)
        (out / f"{drafter}.txt").write_text(text + report + "\n\n" + table)
        del llm, run
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
