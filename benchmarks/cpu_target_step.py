"""What the target's batch-1 decode step would cost on the CPU compiled as the draft's is, against
the eager step the engine runs.

    python benchmarks/cpu_target_step.py [--prompts 4] [--output-len 128] [--cached 320] [--calls 200] [--turns 3]

First the engine's own plain decode at batch 1 (no drafter; ``--prompts`` prompts of 64 tokens,
one after another): ms a generated token. Then one sequence of ``--cached`` tokens (past the demo
target's 256-token window, so its sliding-window layers read a window) and one new token, in turns:
``CompiledDraftStep``'s step (the attention's one-sequence metadata, the model, its LM head,
softmax and max) in torch.compile's ``force_eager`` stance, then compiled (inductor's
``cpp_wrapper``, as the CPU draft's step runs), ``--calls`` times each a turn; medians in ms.

Only the draft's step is compiled in the engine (draft_compile.py); deepspark's batch-1 ratio on the
CPU is measured against this eager target step.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts
from deepinfer_builtin.drafters.draft_model.compile import CompiledDraftStep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--cached", type=int, default=320)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(progress=False, device="cpu", plugins=[])
    engine, runner = llm.engine, llm.engine.runner
    model, attention, caches, bs = runner.model, runner.attention, runner.kv_caches, runner.block_size

    prompts = stdlib_prompts(llm.get_tokenizer(), args.prompts, 64)
    llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    t = time.perf_counter()
    for p in prompts:
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    per_token = (time.perf_counter() - t) / (args.prompts * args.output_len)
    print(f"engine, no drafter, batch 1: {1 / per_token:.1f} tok/s, {per_token * 1e3:.2f} ms a token "
          "(the prompts' steps included)")

    step = CompiledDraftStep(model, attention, caches, bs, runner.device)
    t = time.perf_counter()
    step.warm_up(engine.kv.pool)
    if step.failed:
        raise SystemExit(f"the target's step did not compile here: {step.failed}")
    print(f"compiling the target's step: {time.perf_counter() - t:.1f} s")

    n = args.cached
    blocks = engine.kv.pool.allocate(-(-(n + 1) // bs))
    ids = [b.block_id for b in blocks]
    feeds = [([5], n, ids)]

    def eager() -> None:  # the same call, run by torch.compile's eager stance
        with torch.compiler.set_stance("force_eager"):
            step.run(feeds)

    try:
        with torch.inference_mode():
            for turn in range(args.turns):
                found = {}
                for name, call in (("eager", eager), ("compiled", lambda: step.run(feeds))):
                    secs = []
                    for _ in range(args.calls):
                        t = time.perf_counter()
                        call()
                        secs.append(time.perf_counter() - t)
                    found[name] = statistics.median(secs) * 1e3
                print(f"turn {turn + 1}: one token after {n} cached, ms (median of {args.calls}): "
                      f"eager {found['eager']:.2f}, compiled {found['compiled']:.2f} "
                      f"({found['eager'] / found['compiled']:.2f}x)")
    finally:
        engine.kv.pool.free(blocks)
    print(f"blocks free after: {engine.kv.pool.num_free_blocks} of {engine.kv.pool.num_blocks}")


if __name__ == "__main__":
    main()
