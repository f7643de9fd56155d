"""What a speculative round's device work costs by its depth k, on the demo pair: the device time of
one replay of the target's verification graph (k + 1 rows a sequence), of the draft's loop graph (k
steps) and of the target's one-token decode graph, at each batch size given (CUDA events around
replays of the captured graphs, after a short generate: no host work in the figures).

    python3 benchmarks/h200_depth_cost.py [--ks 2,3,4,5,6] [--batches 1,64]
"""
from __future__ import annotations

import argparse
import gc
import statistics

import torch

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def replay_us(replay, trials: int = 30, reps: int = 20) -> float:
    """Median device microseconds of one replay (``reps`` back to back between two events)."""
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(times)


def graph_at(graphs, batch: int):
    """The replay of the smallest captured size that holds ``batch`` sequences, and that size."""
    size = min(s for s in graphs.sizes if s >= batch)
    return graphs._replays[size][0], size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="2,3,4,5,6")
    ap.add_argument("--batches", default="1,64")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    print(f"{'k':>2s} {'batch':>5s} {'verify us':>10s} {'loop us':>8s} {'decode us':>10s}")
    for k in (int(x) for x in a.ks.split(",")):
        llm = LLM(None, progress=False, device="sm90", plugins=["draft-model"], kv_cache_memory_gb=2,
                  plugin_options={"draft-model": {"num_speculative_tokens": k}})
        prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), max(batches), 64)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
        runner, draft = llm.engine.runner, llm.engine.drafter.runner
        verify = runner.verify_graphs_multi or runner.verify_graphs
        for b in batches:
            v, size = graph_at(verify, b)
            loop, loop_size = graph_at(draft.loop, b)
            dec, _ = graph_at(runner.graphs, b)
            print(f"{k:2d} {b:5d} {replay_us(v):10.1f} {replay_us(loop):8.1f} {replay_us(dec):10.1f}"
                  f"   (captured sizes {size}, loop {loop_size})", flush=True)
        del llm, runner, draft, verify
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
