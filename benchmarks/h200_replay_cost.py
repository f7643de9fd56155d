"""What launching a captured graph costs the host during a greedy generate on the demo pair: the
wall time of each ``replay()`` call (the launch only; the device runs it afterwards), by kind of
graph and captured size, split by whether the device's stream was idle when the launch began
(``Stream.query()``). Per drafter, at the batch size given.

    python3 benchmarks/h200_replay_cost.py [--drafters none,draft-model] [--batch 64] [--output-len 128]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def wrap(table: dict, kind: str, found: dict) -> None:
    """Time every call of the replays in ``table`` (size -> (replay, out), or size -> replay)."""
    stream = torch.cuda.current_stream()
    for size, entry in list(table.items()):
        replay = entry[0] if isinstance(entry, tuple) else entry

        def timed(replay=replay, key=(kind, size)):
            idle = stream.query()
            t = time.perf_counter()
            replay()
            found[key, idle].append(time.perf_counter() - t)
        table[size] = (timed, entry[1]) if isinstance(entry, tuple) else timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafters", default="none,draft-model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    a = ap.parse_args()
    for drafter in a.drafters.split(","):
        llm = LLM(None, progress=False, device="sm90", plugins=[] if drafter == "none" else [drafter],
                  kv_cache_memory_gb=2)
        prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), a.batch, 64)]
        params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: compiles, captures
        found: dict = collections.defaultdict(list)
        runner = llm.engine.runner
        for kind in ("graphs", "verify_graphs", "verify_graphs_multi"):
            g = getattr(runner, kind, None)
            if g is not None:
                wrap(g._replays, kind, found)
        loop = getattr(getattr(llm.engine.drafter, "runner", None), "loop", None)
        if loop is not None:
            wrap(loop._replays, "loop", found)
            wrap(loop._chains, "loop chain inputs", found)
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        print(f"{drafter}, batch {a.batch} x {a.output_len} tokens: {wall:.3f} s")
        print(f"  {'graph':22s} {'size':>4s} {'device idle':>11s} {'replays':>7s} {'median us':>9s} {'p90 us':>7s} "
              f"{'us total':>9s}")
        for (kind, size), idle in sorted(found, key=lambda k: (k[0][0], k[0][1], k[1])):
            xs = sorted(found[(kind, size), idle])
            print(f"  {kind:22s} {size:4d} {idle!s:>11s} {len(xs):7d} {statistics.median(xs) * 1e6:9.1f} "
                  f"{xs[int(0.9 * (len(xs) - 1))] * 1e6:7.1f} {sum(xs) * 1e6:9.0f}")
        del llm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
