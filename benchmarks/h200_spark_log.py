"""Where deepspark's speculative rounds go at 64 requests: bench spec's batch-64 workload (64
held-out prompts, greedy, --output-len new tokens, a 4-token warm-up, then --runs runs), with each
round's choice logged (RoundRates.speculate wrapped; batches under skip_min_batch always
speculate). Prints, per run: seconds, target steps, rounds of each kind per batch-size class, the
choices at 64 requests as runs of S (speculative) and P (plain), and the estimate after it; and
the same runs' seconds for no drafter, interleaved.

    python3 benchmarks/h200_spark_log.py [--device sm90] [--output-len 256] [--runs 5]
"""
from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter

import torch

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="sm90")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--options", default="{}", help="deepspark's plugin options, JSON")
    a = ap.parse_args()
    import json

    spark = LLM(None, progress=False, device=a.device, plugins=["deepspark"], kv_cache_memory_gb=2,
                plugin_options={"deepspark": json.loads(a.options)})
    none = LLM(None, progress=False, device=a.device, kv_cache_memory_gb=2)
    d = spark.engine.drafter
    log: list[tuple[int, bool]] = []
    original = d.rates.speculate

    def speculate(batch: int, *rest) -> tuple[bool, bool]:
        out = original(batch, *rest)
        log.append((batch, out[0]))
        return out

    d.rates.speculate = speculate
    below = Counter()
    original_skip = d.may_skip

    def may_skip(batch: int) -> bool:
        ok = original_skip(batch)
        if not ok:
            below[batch] += 1
        return ok

    d.may_skip = may_skip
    samples: list[tuple[bool, float]] = []  # (speculative, us a token a request) recorded at 64
    original_record = d.rates.record

    def record(speculative: bool, batch: int, seconds: float, tokens: int) -> None:
        if d.rates.size_class(batch) == 64:
            samples.append((speculative, seconds * 1e6 * batch / max(tokens, 1)))
        original_record(speculative, batch, seconds, tokens)

    d.rates.record = record
    prompts = stdlib_prompts(spark.get_tokenizer(), a.prompts, 64)
    params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def run(llm: LLM) -> float:
        sync()
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        sync()
        return time.perf_counter() - t

    for llm in (spark, none):
        llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
    for i in range(a.runs):
        log.clear()
        below.clear()
        samples.clear()
        m0 = spark.get_metrics()
        secs = run(spark)
        m = {k: v - m0.get(k, 0) for k, v in spark.get_metrics().items()}
        base = run(none)
        by_class = Counter((d.rates.size_class(b), s) for b, s in log)
        at64 = "".join("S" if s else "P" for b, s in log if d.rates.size_class(b) == 64)
        runs = " ".join(f"{k}{len(list(g))}" for k, g in itertools.groupby(at64))
        print(f"run {i}: deepspark {secs:.3f} s, none {base:.3f} s ({base / secs:.2f}x); "
              f"{m['deepinfer:generation_tokens'] / m['deepinfer:request_sampling_steps']:.2f} tok/step; "
              f"rounds by (class, speculative): {dict(sorted(by_class.items()))}; "
              f"below skip_min_batch: {sum(below.values())} rounds", flush=True)
        print(f"  at 64: {runs}")
        groups = [(k, [v for _, v in g]) for k, g in itertools.groupby(samples, key=lambda x: x[0])]
        print("  samples at 64, run by run (us a token a request): " + " ".join(
            f"{'S' if k else 'P'}{len(v)}:{sorted(v)[len(v) // 2]:.0f}" for k, v in groups))
        print("  estimate (us a token): " + ", ".join(
            f"{'spec' if s else 'plain'}@{c} {v * 1e6:.0f}" for (s, c), v in sorted(d.rates.seconds.items())))


if __name__ == "__main__":
    main()
