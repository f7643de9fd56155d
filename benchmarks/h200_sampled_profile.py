"""Where a sampled batch-1 decode step's host time goes on a GPU (session 43): the demo model, no
drafter, greedy and then temperature 0.8 (seeded), one prompt at a time; tok/s of each, then a
cProfile of the sampled runs (cumulative and own time).

    python3 benchmarks/h200_sampled_profile.py [--prompts 4] [--output-len 256] [--device sm90]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--device", default="sm90")
    a = ap.parse_args()
    llm = LLM(progress=False, device=a.device, plugins=[])
    prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), a.prompts, 64)]
    kinds = {"greedy": lambda i: SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True),
             "sampled": lambda i: SamplingParams(temperature=0.8, seed=i, max_tokens=a.output_len, ignore_eos=True)}

    def run(make) -> float:
        t = time.perf_counter()
        for i, p in enumerate(prompts):
            llm.generate([p], make(i), use_tqdm=False)
        return a.prompts * a.output_len / (time.perf_counter() - t)

    for make in kinds.values():
        run(make)  # warm-up
    for turn in range(2):
        print(f"turn {turn}: " + ", ".join(f"{k} {run(m):.1f} tok/s" for k, m in kinds.items()), flush=True)
    prof = cProfile.Profile()
    prof.enable()
    run(kinds["sampled"])
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(35)
    st.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
