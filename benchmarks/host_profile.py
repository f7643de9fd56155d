"""Shared by the H200 profiling scripts: one timed run, then one under cProfile; a method's time
and calls counted; the demo pair's batch-1 setup of the host-timing scripts."""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections import Counter
from collections.abc import Callable


def count_calls(owner, name: str, stats: Counter) -> None:
    """Replace ``owner.name`` (a class's method or an object's) with a wrapper that adds its
    seconds to ``stats[name, "s"]`` and its calls to ``stats[name, "n"]``."""
    fn = getattr(owner, name)

    def counted(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stats[name, "s"] += time.perf_counter() - t
            stats[name, "n"] += 1
    setattr(owner, name, counted)


def timed(run: Callable[[], object], sync: Callable[[], object] = lambda: None) -> float:
    """Wall seconds of one ``run()``, with ``sync()`` (the device's queue drained) before and after."""
    sync()
    t = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - t


def profiled(run: Callable[[], object], top: int, sorts: tuple[str, ...] = ("tottime",)) -> str:
    """cProfile's report of one ``run()``: the ``top`` functions under each of ``sorts``."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    s = io.StringIO()
    stats = pstats.Stats(prof, stream=s)
    for key in sorts:
        stats.sort_stats(key).print_stats(top)
    return s.getvalue()


def demo_batch1(description: str, batched: bool = False):
    """(args, LLM, prompts, params) for a host-timing script on the demo pair at batch 1: options
    --drafter (or "none"), --device, --prompts and --output-len; with ``batched``, also --batch
    (prompts decoded together) and --options (the drafter's, as JSON)."""
    from deepinfer.bench.spec import stdlib_prompts
    from deepinfer.core.sampling_params import SamplingParams
    from deepinfer.llm import LLM

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--drafter", default="deepspark")
    ap.add_argument("--device", default="sm90")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=256)
    if batched:
        ap.add_argument("--batch", type=int, default=1)
        ap.add_argument("--options", type=json.loads, default={})
    a = ap.parse_args()
    options = {a.drafter: a.options} if batched and a.options else {}
    llm = LLM(None, progress=False, device=a.device, plugins=[] if a.drafter == "none" else [a.drafter],
              kv_cache_memory_gb=2, plugin_options=options)
    prompts = stdlib_prompts(llm.get_tokenizer(), a.prompts, 64)
    return a, llm, prompts, SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
