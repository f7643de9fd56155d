"""Shared by the H200 profiling scripts: one timed run, then one under cProfile."""
from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable


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
