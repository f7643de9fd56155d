"""Where the host's time goes in deepspark's rounds on the GPU (batch 1 by default), function by function: each
listed function is wrapped to add up its inclusive wall time (perf_counter, no profiler, so the host
runs near its own speed), and the report gives each one's calls and microseconds a verification
step (inclusive: nested functions are also in their callers' figures; those that wait for the
device include the wait).

    python3 benchmarks/h200_host_parts.py [--drafter deepspark] [--device sm90] [--prompts 4] [--batch 1]
        [--options '{"lookup": false}']
"""
from __future__ import annotations

import importlib
import time

from host_profile import demo_batch1

# (module, class or None, function)
PARTS = [
    ("deepinfer.llm", "LLM", "_run"),
    ("deepinfer.core.engine", "LLMEngine", "step"),
    ("deepinfer.core.engine", "LLMEngine", "_propose"),
    ("deepinfer.core.engine", "LLMEngine", "_decoding"),
    ("deepinfer.core.engine", "LLMEngine", "_take"),
    ("deepinfer.core.engine", "LLMEngine", "_account"),
    ("deepinfer.core.engine", "LLMEngine", "_deliver"),
    ("deepinfer.core.engine", "LLMEngine", "_finish"),
    ("deepinfer.core.engine", "LLMEngine", "_emit"),
    ("deepinfer.core.engine", "LLMEngine", "_update_gauges"),
    ("deepinfer.core.output", "RequestState", "to_output"),
    ("deepinfer.core.detokenizer", "IncrementalDetokenizer", "add"),
    ("deepinfer_builtin.schedulers.fcfs", "FCFSScheduler", "schedule"),
    ("deepinfer_builtin.schedulers.fcfs", "FCFSScheduler", "update_after_step"),
    ("deepinfer.core.model_runner", "ModelRunner", "launch"),
    ("deepinfer.core.model_runner", "ModelRunner", "_inputs"),
    ("deepinfer.core.model_runner", "ModelRunner", "_verify"),
    ("deepinfer.core.model_runner", "ModelRunner", "collect"),
    ("deepinfer.core.graphs", "DecodeGraphs", "run_padded"),
    ("deepinfer.core.graphs", "DecodeGraphs", "_upload_and_replay"),
    ("deepinfer_builtin.drafters.deepspark.drafter", "DeepSparkDrafter", "propose"),
    ("deepinfer_builtin.drafters.deepspark.drafter", "DeepSparkDrafter", "_draft"),
    ("deepinfer_builtin.drafters.deepspark.drafter", "DeepSparkDrafter", "observe"),
    ("deepinfer_builtin.drafters.deepspark.drafter", "DeepSparkDrafter", "needs_tokens"),
    ("deepinfer_builtin.drafters.deepspark.lookup", "LookupDrafts", "choose"),
    ("deepinfer_builtin.drafters.deepspark.lookup", "LookupDrafts", "round_starts"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "propose"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_propose_in_loop"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_catch_up"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_eager"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_forward_last"),
    ("deepinfer_builtin.drafters.deepspark.lookup", "LookupDrafts", "_candidate"),
    ("deepinfer_builtin.drafters.draft_model.loop", "DraftLoopGraphs", "run_padded"),
    ("deepinfer_builtin.drafters.draft_model.loop", "DraftLoopGraphs", "run_chained"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "chain"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_take_chained"),
    ("deepinfer_builtin.drafters.draft_model.drafter", "DraftModelDrafter", "propose"),
    ("deepinfer_builtin.drafters.draft_model.loop", "LoopRound", "lists"),
    ("deepinfer_builtin.drafters.draft_model.loop", "LoopRound", "__init__"),
    # a verification step's parts between its graph's replay and the chained round's (session 34)
    ("deepinfer.models.llama", "LlamaForCausalLM", "compute_logits"),
    ("deepinfer.core.host_copy", "HostCopy", "__init__"),
    ("deepinfer.core.host_copy", "HostCopy", "wait"),
    ("deepinfer_builtin.drafters.deepspark.drafter", "DeepSparkDrafter", "on_verified"),
    ("deepinfer_builtin.drafters.draft_model.drafter", "DraftModelDrafter", "on_verified"),
    ("deepinfer_builtin.drafters.draft_model.runner", "DraftRunner", "_reserve"),
    ("deepinfer_builtin.drafters.draft_model.loop", "DraftLoopGraphs", "_await_turn"),
    ("deepinfer.core.packed_inputs", "PackedInputs", "upload"),
]


def main() -> None:
    a, llm, prompts, params = demo_batch1(__doc__, batched=True)
    runs = [[{"prompt_token_ids": p} for p in prompts[i:i + a.batch]] for i in range(0, len(prompts), a.batch)]
    clock = time.perf_counter
    totals: dict[str, list[float]] = {}  # name -> [calls, seconds]

    def wrap(name, fn):
        acc = totals.setdefault(name, [0, 0.0])

        def timed(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += 1
                acc[1] += clock() - t
        return timed

    originals = []
    for mod, cls, fn in PARTS:
        owner = getattr(importlib.import_module(mod), cls)
        originals.append((owner, fn, owner.__dict__[fn]))
        setattr(owner, fn, wrap(f"{cls}.{fn}", owner.__dict__[fn]))
    try:
        llm.generate(runs[0], params, use_tqdm=False)  # warm-up
        for acc in totals.values():
            acc[:] = [0, 0.0]
        t = clock()
        for run in runs:
            llm.generate(run, params, use_tqdm=False)
        wall = clock() - t
    finally:
        for owner, fn, orig in originals:
            setattr(owner, fn, orig)
    steps = totals["LLMEngine.step"][0]
    tokens = a.prompts * a.output_len
    print(f"{a.drafter} {a.options or ''} batch {a.batch}, {a.prompts} prompts x {a.output_len} tokens: {tokens / wall:.1f} tok/s, "
          f"{steps} steps, {wall / steps * 1e6:.1f} us a step")
    print(f"  {'function':40s} {'calls/step':>10s} {'us/step':>9s} {'us/call':>9s}")
    for name, (calls, secs) in totals.items():
        if calls:
            print(f"  {name:40s} {calls / steps:10.2f} {secs / steps * 1e6:9.1f} {secs / calls * 1e6:9.1f}")


if __name__ == "__main__":
    main()
