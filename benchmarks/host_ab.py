"""The core's host work before and after a change, in one process, on the same engines: for the
"old" turns, the methods of the old versions of some core classes are swapped in (files in --old,
made with e.g. ``git show 6eac371:deepinfer/core/engine.py > _old/engine.py``). Each configuration
runs both versions in turns, run by run, so that a host whose speed drifts slows both alike.

    python3 benchmarks/host_ab.py --old _old [--device sm90] [--batch 64] [--prompts 64] [--runs 7]
        none draft-model deepspark

Swapped: ``LLMEngine`` (engine.py) and ``KVCacheManager`` (kv_manager.py), where the files exist.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
from pathlib import Path

from deepinfer.bench.spec import Workload, take_turns
from deepinfer.llm import LLM

CLASSES = {"engine": ("deepinfer.core.engine", "LLMEngine"),
           "kv_manager": ("deepinfer.core.kv_manager", "KVCacheManager")}


def old_methods(old_dir: Path) -> list[tuple[type, str, object, object]]:
    """(class, name, new function, old function) for every function of the old classes."""
    swaps = []
    for stem, (mod, cls) in CLASSES.items():
        path = old_dir / f"{stem}.py"
        if not path.exists():
            continue
        spec = importlib.util.spec_from_file_location(f"_old_{stem}", path)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        new_cls, old_cls = getattr(importlib.import_module(mod), cls), getattr(old, cls)
        for name, fn in vars(old_cls).items():
            if callable(fn) and not name.startswith("__"):
                swaps.append((new_cls, name, new_cls.__dict__.get(name), fn))
    return swaps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="none, draft-model, deepspark, ngram")
    ap.add_argument("--old", required=True, help="directory with the old engine.py / kv_manager.py")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    swaps = old_methods(Path(a.old))

    def use(old: bool) -> None:
        for cls, name, new_fn, old_fn in swaps:
            if old:
                setattr(cls, name, old_fn)
            elif new_fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, new_fn)

    llms = {}
    for cfg in a.configs:
        llm = LLM(None, progress=False, device=a.device, plugins=[] if cfg == "none" else [cfg], kv_cache_memory_gb=2)
        llm.engine._text_later = []  # the old engine's, made in its __init__
        llms[cfg, "new"], llms[cfg, "old"] = (llm, False), (llm, True)
    wl = Workload(next(iter(llms.values()))[0], a.batch,
                  {"prompts": a.prompts, "input_len": 64, "output_len": a.output_len})

    def run(entry) -> float:
        llm, old = entry
        use(old)
        try:
            return wl.run(llm)
        finally:
            use(False)

    for entry in llms.values():
        run(entry)  # warm-up (compiles, captures) under both versions
    secs = take_turns(llms, run, a.runs)
    print(f"batch {a.batch}, {a.prompts} prompts x {a.output_len} tokens, {a.runs} runs a version, "
          f"{len(swaps)} methods swapped")
    for cfg in a.configs:
        new, old = (wl.tokens / statistics.median(secs[cfg, v]) for v in ("new", "old"))
        print(f"{cfg:14s} new {new:9.1f} tok/s  old {old:9.1f} tok/s  new/old {new / old:5.3f}  "
              "runs new: " + " ".join(f"{x:.3f}" for x in secs[cfg, "new"])
              + "  old: " + " ".join(f"{x:.3f}" for x in secs[cfg, "old"]))


if __name__ == "__main__":
    main()
