"""Where a CPU draft step's time goes, inside a deepspark engine at batch 1 and in a tight loop,
and what the draft's LM head costs by the rows it keeps.

    python benchmarks/cpu_draft_step_parts.py [--prompts 8] [--output-len 256] [--calls 300]

Parts, each timed around its own call (wall time, median and mean a call):
- ``inductor``: the compiled step's generated code (its C++ entry and the operators it calls);
- ``dynamo``: the call through torch.compile (``CompiledDraftStep._step``), inductor included;
- ``run``: ``CompiledDraftStep.run``, which also builds the step's inputs (slots, metadata);
- ``runner``: ``DraftRunner.propose`` a draft step (its rounds' seconds over their steps).
Then the same step ``--calls`` times in a row on blocks taken from the draft's pool (freed again).

Last, the draft's LM head with the final norm, softmax and max (what its greedy step computes after
the layers) over its first N rows, warm (called in a row) and cold (after writing 64 MiB): what
restricting the draft's vocabulary to its N most frequent tokens would save a step (FR-Spec).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from torch._inductor.output_code import CompiledFxGraph

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts
from deepinfer_builtin.drafters.draft_model.compile import CompiledDraftStep
from deepinfer_builtin.drafters.draft_model.runner import DraftRunner

times: dict[str, list[float]] = defaultdict(list)


def timed(owner, name: str, key: str) -> None:
    f = getattr(owner, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        times[key].append(time.perf_counter() - t)
        return out
    setattr(owner, name, wrapper)


def show(label: str, steps: int) -> None:
    for key in ("inductor", "dynamo", "run"):
        v = times[key]
        print(f"  {label} {key:<9} {len(v):5d} calls, median {statistics.median(v) * 1e3:.3f} ms, "
              f"mean {sum(v) / len(v) * 1e3:.3f} ms")
    if times["runner"]:
        print(f"  {label} runner    {sum(times['runner']) / steps * 1e3:.3f} ms a draft step "
              f"({len(times['runner'])} rounds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    timed(CompiledFxGraph, "__call__", "inductor")
    timed(CompiledDraftStep, "run", "run")
    timed(DraftRunner, "propose", "runner")
    llm = LLM(progress=False, device="cpu", plugins=["deepspark"])
    runner = llm.engine.drafter.runner
    step = runner.compiled
    if step is None or step.failed:
        raise SystemExit(f"the draft's step is not compiled here ({step and step.failed})")
    timed(step, "_step", "dynamo")
    prompts = stdlib_prompts(llm.get_tokenizer(), args.prompts, 64)
    llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    times.clear()
    t = time.perf_counter()
    for p in prompts:
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    print(f"deepspark at batch 1: {args.prompts * args.output_len / (time.perf_counter() - t):.1f} tok/s")
    show("engine", len(times["run"]))

    # the same step in a row: one sequence of 200 cached tokens plus the new one
    blocks = runner.pool.allocate(-(-201 // runner.block_size))
    try:
        feeds = [([5], 200, [b.block_id for b in blocks])]
        with torch.inference_mode():
            for _ in range(30):
                step.run(feeds)
            times.clear()
            for _ in range(args.calls):
                step.run(feeds)
    finally:
        runner.pool.free(blocks)
    show("in a row", 0)

    model = runner.model
    weight = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    linear = model.linear_op or torch.nn.functional.linear
    hidden = torch.randn(1, weight.shape[1], dtype=weight.dtype)
    flush = torch.empty(64 << 20, dtype=torch.uint8)
    print(f"the draft's LM head ({tuple(weight.shape)}, {weight.dtype}), us a call (median of {args.calls}):")
    with torch.inference_mode():
        for rows in (weight.shape[0], weight.shape[0] * 3 // 4, weight.shape[0] // 2, weight.shape[0] // 4):
            w = weight[:rows].contiguous()
            found = []
            for cold in (False, True):
                secs = []
                for _ in range(args.calls):
                    if cold:
                        flush.add_(1)
                    t = time.perf_counter()
                    linear(model.model.norm(hidden), w).float().softmax(-1).max(-1)
                    secs.append(time.perf_counter() - t)
                found.append(statistics.median(secs) * 1e6)
            print(f"  {rows:6d} rows: warm {found[0]:.0f}, cold {found[1]:.0f}")


if __name__ == "__main__":
    main()
