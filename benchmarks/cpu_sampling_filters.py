"""Sampling with top-k and top-p on the CPU: each row's candidates among its largest logits
(``filters.CANDIDATES``) against a sort of the whole row (``CANDIDATES`` emptied), in one process.

    python benchmarks/cpu_sampling_filters.py [--requests 64] [--output-len 128] [--turns 2]

The demo target decodes ``--requests`` prompts of 64 tokens (held-out standard-library files, as
bench spec's) at once, ``--output-len`` new tokens each, sampled at temperature 0.8 with each
filter below (seeded), the two ways taking turns: tok/s. Then ``filtered_weights`` alone on the
logits of the last step of 64 rows (or the batch's) that the engine sampled with top-p 0.9, both
ways, 20 calls each: median ms a call.
"""
from __future__ import annotations

import argparse
import statistics
import time

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core import filters

FILTERS = {"temperature only": {}, "top-p 0.9": {"top_p": 0.9}, "top-p 0.95": {"top_p": 0.95},
           "top-k 50": {"top_k": 50}, "top-k 50, top-p 0.9": {"top_k": 50, "top_p": 0.9}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--turns", type=int, default=2)
    a = ap.parse_args()
    llm = LLM(progress=False, device="cpu", plugins=[])
    reqs = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), a.requests, 64)]
    llm.generate(reqs[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    stages = filters.CANDIDATES
    captured = {}
    real = filters.filtered_weights

    def capture(logits, dev, sort, host=None):
        if sort and host is not None:
            captured["args"] = (logits.clone(), dev.clone(), sort, host.copy())
        return real(logits, dev, sort, host)

    rates: dict[tuple[str, bool], list[float]] = {}
    for turn in range(a.turns):
        for name, kw in FILTERS.items():
            for candidates in (True, False) if turn % 2 == 0 else (False, True):
                filters.CANDIDATES = stages if candidates else ()
                filters.filtered_weights = capture if name == "top-p 0.9" and candidates else real
                params = SamplingParams(temperature=0.8, seed=1, max_tokens=a.output_len, ignore_eos=True, **kw)
                t = time.perf_counter()
                llm.generate(reqs, params, use_tqdm=False)
                rates.setdefault((name, candidates), []).append(a.requests * a.output_len / (time.perf_counter() - t))
    filters.filtered_weights = real
    print(f"{a.requests} requests x {a.output_len} tokens at temperature 0.8, tok/s by turn "
          "(candidates / whole sort)")
    for name in FILTERS:
        on, off = rates[name, True], rates[name, False]
        print(f"  {name:22s} {', '.join(f'{r:.1f}' for r in on)} / {', '.join(f'{r:.1f}' for r in off)}"
              f"  ({statistics.median(on) / statistics.median(off):.2f}x)")
    logits, dev, sort, host = captured["args"]
    for candidates in (True, False):
        filters.CANDIDATES = stages if candidates else ()
        times = []
        for _ in range(22):
            t = time.perf_counter()
            filters.filtered_weights(logits, dev, sort, host)
            times.append(time.perf_counter() - t)
        print(f"filtered_weights, {logits.shape[0]} rows of {logits.shape[1]} (top-p 0.9), "
              f"{'candidates' if candidates else 'whole sort'}: {1e3 * statistics.median(times[2:]):.2f} ms")
    filters.CANDIDATES = stages


if __name__ == "__main__":
    main()
