"""What a speculative round's device work costs by its depth k, on the demo pair: the device time of
each replay of the target's verification graphs (k + 1 rows a sequence), of the draft's loop graph
(k steps) and of the target's one-token decode graphs ("none": no drafter), during a greedy
generate at each batch size given (CUDA events recorded around every replay: no host work in the
figures). Median microseconds a replay, by kind and captured size.

    python3 benchmarks/h200_depth_cost.py [--ks 2,3,4,5,6] [--batches 1,64] [--output-len 64] [--options JSON]

``--options``: plugin options added to every engine's (e.g. '{"sm90": {"gemv_rows": 1}}').
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics

import torch

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def time_replays(graphs, kind: str, events: dict) -> None:
    """Record a pair of CUDA events around every replay of ``graphs``' captured sizes."""
    for size, (replay, out) in list(graphs._replays.items()):
        def timed(replay=replay, key=(kind, size)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            events[key].append((a, b))
        graphs._replays[size] = (timed, out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="2,3,4,5,6")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--options", default="{}")
    a = ap.parse_args()
    extra = json.loads(a.options)
    print(f"{'k':>4s} {'batch':>5s}  median device us a replay (captured size: replays)")
    for k in ["none"] + [int(x) for x in a.ks.split(",")]:
        opts = {**extra, **({} if k == "none" else {"draft-model": {"num_speculative_tokens": k}})}
        llm = LLM(None, progress=False, device="sm90", plugins=[] if k == "none" else ["draft-model"],
                  kv_cache_memory_gb=2, plugin_options=opts)
        tok = llm.get_tokenizer()
        params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
        runner = llm.engine.runner
        for b in (int(x) for x in a.batches.split(",")):
            prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(tok, b, 64)]
            llm.generate(prompts, params, use_tqdm=False)  # warm-up (and the draft's compiles)
            events: dict = collections.defaultdict(list)
            saved = []
            for kind, g in (("decode", runner.graphs), ("verify", runner.verify_graphs),
                            ("verify-multi", runner.verify_graphs_multi),
                            ("loop", None if k == "none" else llm.engine.drafter.runner.loop)):
                if g is not None:
                    saved.append((g, dict(g._replays)))
                    time_replays(g, kind, events)
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
            for g, replays in saved:
                g._replays = replays
            parts = []
            for (kind, size), pairs in sorted(events.items()):
                us = statistics.median(x.elapsed_time(y) * 1000 for x, y in pairs)
                parts.append(f"{kind}@{size} {us:7.1f} ({len(pairs)})")
            print(f"{k!s:>4s} {b:5d}  " + "  ".join(parts), flush=True)
        del llm, runner
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
