"""Where a chained round's time goes (draft-model, batch 1): the host's time in the chain call and in
the verification's wait, and the torch profiler's device kernels, with ``chain_rounds`` on and off.

    python3 benchmarks/h200_chain_profile.py --out DIR [--drafter draft-model] [--output-len 128]
"""
from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch
from host_profile import count_calls

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core import model_runner as runner_mod
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM
from deepinfer_builtin import draft_runner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--drafter", default="draft-model")
    ap.add_argument("--output-len", type=int, default=128)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stats: collections.Counter = collections.Counter()
    for cls, name in ((draft_runner.DraftRunner, "chain"), (draft_runner.DraftRunner, "propose"),
                      (runner_mod.ModelRunner, "_verify"), (runner_mod.ModelRunner, "launch")):
        count_calls(cls, name, stats)
    for chain in (True, False):
        llm = LLM(None, progress=False, device="sm90", plugins=[a.drafter], kv_cache_memory_gb=2,
                  plugin_options={a.drafter: {"chain_rounds": chain}})
        prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), 4, 64)]
        params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
        llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
        stats.clear()
        t = time.perf_counter()
        for p in prompts:
            llm.generate([p], params, use_tqdm=False)
        wall = time.perf_counter() - t
        steps = stats["launch", "n"]
        text = [(f"chain_rounds {chain}: {wall:.3f} s, {4 * a.output_len / wall:.1f} tok/s, {steps} steps, "
                 f"{wall / max(steps, 1) * 1e6:.1f} us a step")]
        for (name, kind), v in sorted(stats.items()):
            if kind == "s":
                n = stats[name, "n"]
                text.append(f"  {name:10s} {n:6d} calls  {v / n * 1e6:8.1f} us a call")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as tp:
            llm.generate(prompts[:1], params, use_tqdm=False)
        text.append(tp.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
        print(text[0], "\n".join(text[1:6]), flush=True)
        (out / f"chain_{chain}.txt").write_text("\n".join(text))
        del llm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
