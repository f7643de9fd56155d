"""Where deepspark's rounds go (at batch 1 by default): rounds of lookups against rounds of the draft model,
their tokens and their wall time (from one proposal to the next), run interleaved with no drafter.

    python3 benchmarks/lookup_rounds.py --device sm90 none off on force [--runs 5]

Configurations: ``none`` (no drafter), ``off``/``on`` (deepspark with ``lookup`` off/on),
``force`` (lookup on, and a round takes the lookup whenever it has one: its rate rule bypassed),
``late`` (lookup on, the engine's ``early_propose`` off: drafts proposed at the next step's start), ``ngram``,
``draft-model``; ``--batch`` decodes that many prompts at once (8 prompts or one batch a run); a
JSON object after ``=`` adds the drafter's options, e.g. ``on={"loop_graph": false}``.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

from deepinfer.bench.spec import Workload, take_turns
from deepinfer.llm import LLM


def instrument(drafter, stats: collections.Counter) -> None:
    """Count each round's kind, its tokens (one plus the accepted drafts) and its seconds."""
    state = {"kind": None, "start": 0.0}
    propose, observe = drafter.propose, drafter.observe

    def timed_propose(requests):
        now = time.perf_counter()
        if state["kind"] is not None:
            stats[state["kind"], "s"] += now - state["start"]
        out = propose(requests)
        buckets = getattr(drafter, "_buckets", None)  # deepspark's; ngram's rounds are all lookups
        kinds = {"lookup" if drafter.name == "ngram" or type((buckets or {}).get(rid)).__name__ == "_Lookup"
                 else "model" for rid in out}
        kind = "plain" if not out else (kinds.pop() if len(kinds) == 1 else "mixed")
        stats[kind, "rounds"] += 1
        if kind == "plain":  # one token a request, never observed
            stats[kind, "tokens"] += len(requests)
        state["kind"], state["start"] = kind, now
        return out

    def counted_observe(request, num_verified, num_accepted):
        kind = state["kind"] or "?"
        stats[kind, "tokens"] += 1 + num_accepted
        stats[kind, "verified"] += num_verified
        return observe(request, num_verified, num_accepted)

    def run_end():
        state["kind"] = None  # a generate's last round ends with it (not timed)

    drafter.propose, drafter.observe, drafter.run_end = timed_propose, counted_observe, run_end


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    llms, stats = {}, {}
    for cfg in a.configs:
        name, _, extra = cfg.partition("=")
        opts = json.loads(extra) if extra else {}
        if name == "none":
            plugins, popts = [], {}
        elif name in ("ngram", "draft-model"):
            plugins, popts = [name], {name: opts} if opts else {}
        else:
            plugins = ["deepspark"]
            popts = {"deepspark": {"lookup": name != "off", **opts}}
        llm = LLM(None, progress=False, device=a.device, plugins=plugins, kv_cache_memory_gb=2,
                  plugin_options=popts)
        d = llm.engine.drafter
        if name == "force":
            d.lookups._faster = lambda gain: True
        if name == "late":
            llm.engine.early_propose = False
        if plugins:
            stats[cfg] = collections.Counter()
            instrument(d, stats[cfg])
        llms[cfg] = llm
    wl = Workload(next(iter(llms.values())), a.batch, {"prompts": a.prompts, "input_len": 64, "output_len": a.output_len})

    def run(llm):
        s = wl.run(llm)
        if llm.engine.drafter is not None and hasattr(llm.engine.drafter, "run_end"):
            llm.engine.drafter.run_end()
        return s

    for llm in llms.values():
        run(llm)
    for st in stats.values():
        st.clear()
    secs = take_turns(llms, run, a.runs)
    base = wl.tokens / statistics.median(secs[a.configs[0]])
    for cfg, s in secs.items():
        tok_s = wl.tokens / statistics.median(s)
        print(f"{cfg:30s} {tok_s:9.1f} tok/s {tok_s / base:5.2f}x  runs(s): " + " ".join(f"{x:.3f}" for x in s))
        st = stats.get(cfg)
        for kind in ("lookup", "model", "mixed", "plain"):
            if st and st[kind, "rounds"]:
                n = st[kind, "rounds"]
                print(f"    {kind:7s} rounds {n:6d}  tokens/round {st[kind, 'tokens'] / n:5.2f}  verified/round "
                      f"{st[kind, 'verified'] / n:5.2f}  us/round {st[kind, 's'] / n * 1e6:8.1f}  "
                      f"share of tokens {st[kind, 'tokens'] / sum(v for (k, f), v in st.items() if f == 'tokens'):.2f}")
        rates = getattr(llms[cfg].engine.drafter, "rates", None)  # deepspark's: us a token a request
        if rates is not None and rates.rounds:
            print("    RoundRates: " + "  ".join(
                f"{'spec' if spec else 'plain'}@{size} {sec * 1e6:.0f} us ({len(rates.rounds[spec, size])})"
                for (spec, size), sec in sorted(rates.seconds.items(), key=lambda kv: (kv[0][1], kv[0][0]))))


if __name__ == "__main__":
    main()
