"""Drafters compared inside one process, runs interleaved: on a host whose speed drifts between
processes and over time (the H200 machine's host-bound runs moved by up to 75% between calls),
alternating the configurations run by run keeps the drift out of their ratio.

    python3 benchmarks/h200_spec_ab.py --batch 1 --drafters none,deepspark [--runs 9] [--device sm90]

A name ending in ``+host`` is that drafter with ``device_drafts`` off (its drafts copied to the
host before the verification is prepared); ``+sync``, with the scheduler's overlap off; ``+step``,
with ``loop_graph`` off (a round's draft steps one by one, its depth from the drafter's rule);
``+always``, deepspark drafting every round (``skip_when_slower`` "never"); ``+overlap``, deepspark
with ``overlap_plain_rounds`` (its plain rounds run only at batches of ``skip_min_batch`` or more: 8 when this was written,
now 1 in device graphs);
``+marginN``, deepspark with ``skip_margin`` N%.

Each configuration is one LLM (all built first, each with a small KV pool); a run decodes
``bench spec``'s held-out prompts (--prompts of them, in batches of --batch); prints every run's
seconds, each configuration's median tok/s, its ratio to the first and its tokens a target step (a
request's; deepspark's share of speculative rounds shows in it).
"""
from __future__ import annotations

import argparse
import statistics

from deepinfer.bench.spec import Workload, take_turns
from deepinfer.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafters", default="none,deepspark")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--device", default="sm90")
    a = ap.parse_args()
    names = a.drafters.split(",")
    llms = {}
    for name in dict.fromkeys(names):
        drafter, *flags = name.split("+")
        unknown = [f for f in flags if f not in ("host", "step", "always", "overlap", "sync")
                   and not (f.startswith("margin") and f[6:].isdigit())]
        if unknown:
            ap.error(f"{name}: unknown flag(s) {unknown}; known: host, step, always, overlap, sync, marginN")
        plugins = [] if drafter == "none" else [drafter]
        mine = {"device_drafts": False} if "host" in flags else {}
        if "step" in flags:  # every round's draft steps one by one (no loop graph)
            mine["loop_graph"] = False
        if "always" in flags:  # deepspark drafting every round
            mine["skip_when_slower"] = "never"
        if "overlap" in flags:  # deepspark's plain rounds with overlap scheduling
            mine["overlap_plain_rounds"] = True
        for f in flags:  # marginN: deepspark's skip_margin N%
            if f.startswith("margin"):
                mine["skip_margin"] = int(f[6:]) / 100
        opts = {drafter: mine} if mine else {}
        if "sync" in flags:
            opts["fcfs"] = {"overlap": False}
        llms[name] = LLM(None, progress=False, device=a.device, plugins=plugins, kv_cache_memory_gb=2,
                         plugin_options=opts)
    wl = Workload(next(iter(llms.values())), a.batch, {"prompts": a.prompts, "input_len": 64,
                                                        "output_len": a.output_len})
    for llm in llms.values():
        wl.run(llm)  # warm-up: the whole workload once
    m0 = {n: llm.get_metrics() for n, llm in llms.items()}
    secs = take_turns(llms, wl.run, a.runs)
    base = wl.tokens / statistics.median(secs[names[0]])
    print(f"batch {a.batch}, {wl.groups * a.batch} prompts, {a.output_len} new tokens, {a.runs} interleaved runs")
    for n, s in secs.items():
        row = wl.row(n, s, m0[n], llms[n].get_metrics())
        print(f"{n:12s} median {row['tok_s']:10.1f} tok/s  {row['tok_s'] / base:5.2f}x  "
              f"{row['tokens_per_step']:.2f} tok/step  runs(s): " + " ".join(f"{x:.3f}" for x in s))
    for n, llm in llms.items():  # deepspark's measured seconds a token, speculative and plain rounds
        rates = getattr(llm.engine.drafter, "rates", None)
        if rates is not None and rates.seconds:
            print(f"{n}: us a token " + ", ".join(f"{'spec' if spec else 'plain'}@{size} {sec * 1e6:.1f}"
                                                 for (spec, size), sec in sorted(rates.seconds.items())))


if __name__ == "__main__":
    main()
