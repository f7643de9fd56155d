"""What deepspark's plain rounds cost against no drafter's steps, in one process: bench spec's
64-request workload (64 prompts x --output-len tokens, greedy), every configuration's engine built
first, then run in turns, run by run. Configurations:

- ``none``, ``none-sync`` (no drafter, overlap scheduling off), ``draft-model``, ``deepspark``;
- ``plain``: deepspark with every round plain (RoundRates' choice replaced by "plain", at every
  batch size); ``plain-overlap``: the same with ``overlap_plain_rounds``.

Prints each one's median tok/s, engine steps a run and wall time a step, and for ``deepspark``
its rounds by kind, the factor the drains put on speculation's rate where no request waits
(RoundRates.speculate), and its RoundRates estimate.

    python3 benchmarks/h200_plain_rounds.py [--device sm90] [--runs 7] [--output-len 256] [configs...]
"""
from __future__ import annotations

import argparse
import statistics
from collections import Counter

from deepinfer.bench.spec import Workload, take_turns
from deepinfer.llm import LLM

CONFIGS = {
    "none": ([], {}),
    "none-sync": ([], {"fcfs": {"overlap": False}}),
    "draft-model": (["draft-model"], {}),
    "deepspark": (["deepspark"], {}),
    "plain": (["deepspark"], {"deepspark": {"skip_min_batch": 1}}),
    "plain-overlap": (["deepspark"], {"deepspark": {"skip_min_batch": 1, "overlap_plain_rounds": True}}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--device", default="sm90")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=256)
    a = ap.parse_args()
    llms, steps, kinds, drains = {}, {}, {}, {}
    for name in a.configs:
        plugins, options = CONFIGS[name]
        llm = LLM(None, progress=False, device=a.device, plugins=plugins, plugin_options=options,
                  kv_cache_memory_gb=2)
        eng = llm.engine
        counter = steps[name] = [0]
        step = eng.step

        def counted(step=step, counter=counter):
            counter[0] += 1
            return step()
        eng.step = counted
        d = eng.drafter
        if name.startswith("plain"):
            d.rates.speculate = lambda batch, *rest: (False, False)
        elif d is not None and hasattr(d, "rates"):
            log = kinds[name] = Counter()
            speculate = d.rates.speculate

            factors = drains[name] = {}

            def logged(batch, *rest, speculate=speculate, log=log, d=d, factors=factors):
                out = speculate(batch, *rest)
                size = d.rates.size_class(batch)
                log[size, out[0]] += 1
                if size in d.rates._closed:  # (where no request waits: the drains' factor)
                    factors.setdefault(size, []).append(d.rates._closed[size][0])
                return out
            d.rates.speculate = logged
        llms[name] = llm
    wl = Workload(next(iter(llms.values())), a.batch, {"prompts": a.batch, "input_len": 64, "output_len": a.output_len})
    for llm in llms.values():
        wl.warm_up(llm)
        wl.run(llm)
    for c in steps.values():
        c[0] = 0
    for k in list(kinds.values()) + list(drains.values()):
        k.clear()
    secs = take_turns(llms, wl.run, a.runs)
    print(f"batch {a.batch}, {a.batch} prompts x {a.output_len} tokens, {a.runs} runs each, interleaved")
    for name, llm in llms.items():
        med = statistics.median(secs[name])
        n = steps[name][0] / a.runs
        print(f"{name:14s} {wl.tokens / med:9.1f} tok/s  {n:6.1f} steps a run  {1e6 * med / n:7.1f} us a step  "
              "runs: " + " ".join(f"{x:.3f}" for x in secs[name]))
        if name in kinds:
            d = llm.engine.drafter
            print(f"  rounds by (size class, speculative): {dict(sorted(kinds[name].items()))}")
            print("  drains' factor on speculation's rate, by size class (min / median / max): " + ", ".join(
                f"{c}: {min(f):.2f} / {sorted(f)[len(f) // 2]:.2f} / {max(f):.2f}" for c, f in sorted(drains[name].items())))
            print("  estimate (us a token a request): " + ", ".join(
                f"{'spec' if s else 'plain'}@{c} {v * 1e6:.0f}" for (s, c), v in sorted(d.rates.seconds.items())))


if __name__ == "__main__":
    main()
