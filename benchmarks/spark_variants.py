"""Drafter configurations side by side in bench spec's order, with where each one's host time goes:
every engine built in one process, then at each batch size a 4-token warm-up and --repeats runs
in turns (deepinfer.bench.spec's Workload and take_turns, as `deepinfer bench spec` runs them).
A configuration is ``label=plugins`` or ``label=plugins:{json plugin options}``, e.g. (a label
ending in ``-nohead``: decode replays without their head graphs, the LM head and argmax eager)

    python3 benchmarks/spark_variants.py --batch 1,64 none= dm=draft-model ds=deepspark \\
        'ds-nolookup=deepspark:{"deepspark": {"lookup": false}}'

Prints bench spec's columns for each, then per run seconds, engine steps a run, milliseconds a step
spent in the drafter's propose and in on_verified (drafting chained behind a verification), and,
for a drafter that chooses between plain and speculative rounds, its choices by size class and its
last estimates of each kind's microseconds a token.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

from host_profile import count_calls

from deepinfer.bench.spec import Workload, take_turns
from deepinfer.llm import LLM


def build(spec: str, device: str, kv_gb: float | None):
    label, _, rest = spec.partition("=")
    plugins, _, opts = rest.partition(":")
    kw = {} if kv_gb is None else {"kv_cache_memory_gb": kv_gb}
    llm = LLM(None, progress=False, device=device, plugins=[p for p in plugins.split(",") if p],
              plugin_options=json.loads(opts) if opts else {}, **kw)
    eng = llm.engine
    if label.endswith("-nohead") and eng.runner.graphs is not None:  # decode replays' logits eager, as before
        eng.runner.graphs._head_replays.clear()
    acc: Counter = Counter()  # (part, "s"): seconds in it, (part, "n"): calls
    count_calls(eng, "step", acc)
    choices: Counter = Counter()
    d = eng.drafter
    if d is not None:
        count_calls(d, "propose", acc)
        if getattr(eng.runner, "on_verified", None) is not None:
            count_calls(eng.runner, "on_verified", acc)
        if hasattr(d, "rates"):
            speculate = d.rates.speculate

            def logged(batch, *more, speculate=speculate):
                out = speculate(batch, *more)
                choices[d.rates.size_class(batch), "S" if out[0] else "P"] += 1
                return out
            d.rates.speculate = logged
    return label, llm, acc, choices


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--stdlib", help="the prompts' standard library (bench spec's --stdlib)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kv-gb", type=float, default=None, help="each engine's KV pool (bench spec: 2 on a GPU)")
    a = ap.parse_args()
    built = [build(s, a.device, a.kv_gb) for s in a.configs]
    llms = {label: llm for label, llm, *_ in built}
    work = {"prompts": a.prompts, "input_len": a.input_len, "output_len": a.output_len, "stdlib": a.stdlib}
    for batch in (int(b) for b in a.batch.split(",")):
        wl = Workload(next(iter(llms.values())), batch, work)
        m0 = {label: wl.warm_up(llm) for label, llm in llms.items()}
        for _, _, acc, choices in built:
            choices.clear()
            acc.clear()
        secs = take_turns(llms, wl.run, a.repeats)
        print(f"batch {batch}: {wl.groups * batch} prompts x {a.output_len} tokens, {a.repeats} runs each, in turns")
        base = None
        for label, llm, acc, choices in built:
            row = wl.row(label, secs[label], m0[label], llm.get_metrics())
            base = base or row["tok_s"]
            steps = acc["step", "n"] / a.repeats
            per = {k: 1e3 * acc[k, "s"] / max(acc["step", "n"], 1) for k in ("step", "propose", "on_verified")}
            print(f"  {label:14s} {row['tok_s']:9.1f} tok/s {row['tok_s'] / base:5.2f}x  "
                  f"tok/step {row['tokens_per_step']:.2f} verified {row['verified_per_draft']:.2f} "
                  f"accepted {row['accepted_per_draft']:.2f}  {steps:.0f} steps a run; ms a step: "
                  f"step {per['step']:.3f} propose {per['propose']:.3f} on_verified {per['on_verified']:.3f}")
            print("      runs: " + " ".join(f"{x:.3f}" for x in secs[label])
                  + (f"  choices: {dict(sorted(choices.items()))}" if choices else ""))
            rates = getattr(llm.engine.drafter, "rates", None)
            if rates is not None and rates.rounds:  # (RoundRates' last estimates: us a token a request)
                print("      us a token (speculative, class): " + " ".join(
                    f"{'S' if k[0] else 'P'}{k[1]}={1e6 * v:.1f}" for k, v in sorted(rates.seconds.items())))
            alone = getattr(getattr(llm.engine.drafter, "alone", None), "rates", None)
            if alone is not None and alone.rounds:  # (a request alone, timed whole: the last 32 of each kind)
                print("      requests alone, us a token: " + " ".join(
                    f"{'S' if k[0] else 'P'}={1e6 * v:.1f}" for k, v in sorted(alone.seconds.items()))
                      + " (" + " ".join(f"{'S' if k[0] else 'P'}:{len(v)}" for k, v in sorted(alone.rounds.items())) + ")")


if __name__ == "__main__":
    main()
