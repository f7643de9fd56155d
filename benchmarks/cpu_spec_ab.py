"""Interleaved A/B of deepspark configurations against no drafter on the demo pair, batch 1.

    python benchmarks/cpu_spec_ab.py '{}' '{"min_value": 0.25, "compile": false}'

Each argument is one deepspark configuration (its plugin options, as JSON; a key "cpu" holds the
cpu device's options for that engine instead). All engines live in
one process and take turns prompt by prompt (the order rotating), so that a machine whose speed
drifts by the minute (this project's CPU) slows them alike. Prints each engine's tokens/s and its
ratio to no drafter, its drafts verified and accepted per draft step, and the medians of its
engine steps, target forwards and proposals (and of the draft's compiled steps: the whole call, and
the compiled code's part).
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts


def _timed(obj, name: str, times: list[float]) -> None:
    inner = getattr(obj, name)

    def call(*args, **kwargs):
        t = time.perf_counter()
        out = inner(*args, **kwargs)
        times.append(time.perf_counter() - t)
        return out

    setattr(obj, name, call)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", help="deepspark plugin options, one JSON object per engine")
    ap.add_argument("--none-cpu", default="{}", help="the cpu device's options for no drafter (JSON)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="times through the prompts")
    ap.add_argument("--output-len", type=int, default=256)
    args = ap.parse_args()
    engines = {"none": LLM(progress=False, plugin_options={"cpu": json.loads(args.none_cpu)})}
    for i, cfg in enumerate(args.configs):
        options = json.loads(cfg)
        cpu = options.pop("cpu", {})
        engines[f"deepspark {i}"] = LLM(progress=False, plugins=["deepspark"],
                                        plugin_options={"deepspark": options, "cpu": cpu})
    prompts = stdlib_prompts(engines["none"].get_tokenizer(), args.prompts, 64)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for name, llm in engines.items():
        llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
        _timed(llm.engine, "step", times[name, "step"])
        _timed(llm.engine.runner.model, "forward", times[name, "target forward"])
        if llm.engine.drafter is not None:
            _timed(llm.engine.drafter, "propose", times[name, "proposal"])
            step = getattr(getattr(llm.engine.drafter, "runner", None), "compiled", None)
            if step is not None:  # the draft's compiled step: the whole call, and the compiled code's
                _timed(step, "run", times[name, "draft step"])
                _timed(step, "_step", times[name, "compiled call"])
    seconds: dict[str, float] = collections.defaultdict(float)
    names = list(engines)
    for r in range(args.rounds):
        for j, prompt in enumerate(prompts):
            turn = (j + r) % len(names)
            for name in names[turn:] + names[:turn]:
                t = time.perf_counter()
                engines[name].generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
                seconds[name] += time.perf_counter() - t
    tokens = args.rounds * len(prompts) * args.output_len
    for i, name in enumerate(names):
        line = f"{name:12s} {args.configs[i - 1] if i else '':40s} {tokens / seconds[name]:7.1f} tok/s " \
               f"{seconds['none'] / seconds[name]:.3f}x"
        m = engines[name].get_metrics()
        drafts = m.get("deepinfer:spec_decode_num_drafts", 0)
        if drafts:
            line += (f"  verified {m['deepinfer:spec_decode_num_verified_tokens'] / drafts:.2f}"
                     f"  accepted {m['deepinfer:spec_decode_num_accepted_tokens'] / drafts:.2f}"
                     f"  tok/step {m['deepinfer:generation_tokens'] / m['deepinfer:request_sampling_steps']:.2f}")
        print(line)
    for (name, part), ts in sorted(times.items()):
        if ts:
            print(f"  {name:12s} {part:15s} median {statistics.median(ts) * 1e3:7.3f} ms  "
                  f"mean {statistics.mean(ts) * 1e3:7.3f} ms  ({len(ts)})")


if __name__ == "__main__":
    main()
