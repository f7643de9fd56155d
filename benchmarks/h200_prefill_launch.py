"""H200: the host side of a batch-1 prefill step's launch (Llama-3.2-1B shape, bf16, 512-token
prompt) with the scheduler's overlap on and off: cProfile over the prefill launches of 4 generates
(after a warm-up), and each launch's wall time. Writes $OUT/prefill_launch_{overlap,sync}.txt.

    python3 benchmarks/h200_prefill_launch.py
"""
import cProfile
import io
import os
import pstats
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.models import build_random_model

out = os.environ.get("OUT", ".")
model = build_random_model("llama-1b", "bfloat16", "cuda")
prompt = [{"prompt_token_ids": [(7 * j) % 1000 + 10 for j in range(512)]}]
params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
for overlap in (True, False):
    llm = LLM(model, device="sm90", dtype="bfloat16", kv_cache_memory_gb=8, progress=False,
              plugin_options={"fcfs": {"overlap": overlap}})
    runner = llm.engine.runner
    launch = runner.launch
    prof = cProfile.Profile()
    walls: list[float] = []
    state = {"on": False}

    def timed(sched, launch=launch, prof=prof, walls=walls, state=state):
        prefill = any(s.num_new_tokens > 1 for s in sched.scheduled)
        if not (prefill and state["on"]):
            return launch(sched)
        t = time.perf_counter()
        prof.enable()
        try:
            return launch(sched)
        finally:
            prof.disable()
            walls.append(time.perf_counter() - t)

    runner.launch = timed
    for _ in range(2):
        llm.generate(prompt, params, use_tqdm=False)
    state["on"] = True
    for _ in range(4):
        torch.cuda.synchronize()
        llm.generate(prompt, params, use_tqdm=False)
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(35)
    st.sort_stats("cumulative").print_stats(35)
    name = "overlap" if overlap else "sync"
    head = f"{name}: prefill launch wall (profiled) " + ", ".join(f"{1000 * w:.1f}" for w in walls) + " ms\n"
    print(head, flush=True)
    with open(f"{out}/prefill_launch_{name}.txt", "w") as f:
        f.write(head + s.getvalue())
    del llm
    torch.cuda.empty_cache()
