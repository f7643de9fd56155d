"""Counters and gauges by their Prometheus names, shared by the core and the plugins."""
from __future__ import annotations

from collections import defaultdict


class Metrics:
    """A flat registry: ``inc`` for counters, ``set`` for gauges, ``observe`` for histograms."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.histograms: dict[str, list[float]] = defaultdict(list)
        self.descriptions: dict[str, str] = {}

    def counter(self, name: str, description: str = "") -> None:
        self.counters.setdefault(name, 0)
        self.descriptions.setdefault(name, description)

    def gauge(self, name: str, description: str = "") -> None:
        self.gauges.setdefault(name, 0)
        self.descriptions.setdefault(name, description)

    def inc(self, name: str, value: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + value

    def set(self, name: str, value: float) -> None:
        self.gauges[name] = value

    def observe(self, name: str, value: float) -> None:
        self.histograms[name].append(value)

    def snapshot(self) -> dict[str, float]:
        return {**self.counters, **self.gauges}

    def drain_histograms(self) -> dict[str, list[float]]:
        out = dict(self.histograms)
        self.histograms.clear()
        return out
