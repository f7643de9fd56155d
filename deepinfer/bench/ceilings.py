"""A card's ceilings (copy bandwidth, bf16 matmul rate): recorded for the cards measured, otherwise
measured once on the card and cached under its name in the user's cache directory."""
from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True, slots=True)
class Ceiling:
    bandwidth: float   # bytes/s, device-to-device copy (bytes read + written)
    bf16_flops: float  # FLOP/s, 8192^3 bf16 matmuls on random data
    source: str = "recorded"


# by the exact name torch reports (an H100 PCIe or an H200 NVL differs); see docs/benchmarks.md
RECORDED = {
    "NVIDIA H200": Ceiling(4.23e12, 804e12, "recorded 2026-11-29"),
    "NVIDIA H100 80GB HBM3": Ceiling(3.03e12, 770e12, "recorded 2026-12-07"),
}


def cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "deepinfer" / "ceilings.json"


def card_ceiling(device: torch.device) -> tuple[str, Ceiling | None]:
    """The card's name and its ceilings (None on a device that is no CUDA card)."""
    if device.type != "cuda":
        return device.type, None
    name = torch.cuda.get_device_name(device)
    return name, ceiling_for(name, lambda: measure(device), cache_file())


def ceiling_for(name: str, measure_card: Callable[[], Ceiling], path: Path) -> Ceiling:
    """The recorded entry for ``name``, else the one cached in ``path``, else ``measure_card()``
    (then cached there)."""
    if name in RECORDED:
        return RECORDED[name]
    cached = _read(path)
    if name in cached:
        c = cached[name]
        return Ceiling(c["bandwidth"], c["bf16_flops"], c["source"])
    got = measure_card()
    cached[name] = asdict(got)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cached, indent=2))
    tmp.replace(path)
    return got


def _read(path: Path) -> dict:
    try:
        got = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise RuntimeError(f"cannot read the cached ceilings in {path} ({e}); delete the file and they are "
                           f"measured again") from e
    return got if isinstance(got, dict) else {}


def measure_before_run(overrides: dict) -> None:
    """Measure (or look up) the card's ceilings before the engine takes its memory."""
    if overrides.get("device", "auto") != "cpu" and torch.cuda.is_available():
        card_ceiling(torch.device("cuda", torch.cuda.current_device()))


def measure(device: torch.device, seconds: float = 1.0) -> Ceiling:
    """About ``seconds`` of device-to-device copies of a large buffer; the 8192^3 bf16 matmul as the
    recorded entries were measured (the median of five trials, each the mean of ten timed products
    after three warm-ups: a longer run throttles, an H100 falling from 770 to about 690 TFLOP/s)."""
    free, _ = torch.cuda.mem_get_info(device)
    return Ceiling(_copy_rate(device, min(1 << 30, free // 8), seconds), _matmul_rate(device, 8192),
                   f"measured {time.strftime('%Y-%m-%d')}")


def _copy_rate(device: torch.device, nbytes: int, seconds: float) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    once = mean_seconds(lambda: dst.copy_(src), 1, device)
    return 2 * nbytes / mean_seconds(lambda: dst.copy_(src), max(10, int(seconds / once)), device)


def _matmul_rate(device: torch.device, m: int) -> float:
    a = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    return 2 * m ** 3 / statistics.median(mean_seconds(lambda: torch.mm(a, b), 10, device) for _ in range(5))


def mean_seconds(fn: Callable[[], object], calls: int, device: torch.device, warmups: int = 3) -> float:
    """Seconds one call takes: the mean of ``calls`` timed with device events, after ``warmups``."""
    for _ in range(warmups):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls
