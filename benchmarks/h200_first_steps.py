"""H200: a timeline of the first steps of the latency workload (Llama-3.2-1B shape, bf16, one
512-token prompt, 256 new tokens), to see where the time to the first token goes: for each of the
first steps, when the engine's step began and ended, how long the runner's launch and collect
took, relative to the request's arrival; then the first token's time. Prints to stdout.

    python3 benchmarks/h200_first_steps.py [--overlap 0|1]
"""
from __future__ import annotations

import argparse
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overlap", type=int, default=1)
    a = ap.parse_args()
    model = build_random_model("llama-1b", "bfloat16", "cuda")
    llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False,
              plugin_options={"fcfs": {"overlap": bool(a.overlap)}})
    eng = llm.engine
    events: list[tuple[str, float]] = []

    def wrap(obj, name):
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            events.append((name + "<", time.perf_counter()))
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((name + ">", time.perf_counter()))
        setattr(obj, name, timed)

    for obj, name in ((eng, "step"), (eng.runner, "launch"), (eng.runner, "collect")):
        wrap(obj, name)
    prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
    params = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
    for rep in range(3):
        events.clear()
        torch.cuda.synchronize()
        t0, mono = time.perf_counter(), time.monotonic()
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        total = time.perf_counter() - t0
        m = out.metrics
        print(f"run {rep}: {total * 1000:.1f} ms, {256 / total:.1f} tok/s; arrival at "
              f"{1000 * (m['arrival_time'] - mono):.2f} ms, first token at {1000 * (m['first_token_time'] - mono):.2f} ms")
        steps = 0
        for name, t in events:
            print(f"  {1000 * (t - t0):8.3f} ms  {name}")
            if name == "step>":
                steps += 1
                if steps >= 5:
                    break


if __name__ == "__main__":
    main()
