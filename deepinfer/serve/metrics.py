"""Prometheus metrics of the server: latency histograms measured here, engine and plugin metrics relayed."""
from __future__ import annotations

import re
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0)
_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
#: counters kept one per draft position (``..._pos_<i>``), exposed as one family labelled by position
_PER_POSITION = re.compile(r"^(.*)_pos_(\d+)$")


def _prom_name(name: str) -> str:
    if not name.startswith("deepinfer:"):
        name = "deepinfer:" + name
    return name if _NAME_OK.match(name) else re.sub(r"[^a-zA-Z0-9_:]", "_", name)


class _EngineCollector:
    """Exposes the engine's latest counters and gauges, whatever the core and plugins registered."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def collect(self):
        snap = self.snapshot
        desc = snap.get("descriptions", {})
        per_position: dict[str, list[tuple[int, float]]] = {}
        for name, value in sorted(snap.get("counters", {}).items()):
            if (match := _PER_POSITION.match(name)) is not None:
                per_position.setdefault(match[1], []).append((int(match[2]), value))
                continue
            base = _prom_name(name).removesuffix("_total")
            fam = CounterMetricFamily(base, desc.get(name) or f"engine counter {name}")
            fam.add_metric([], value)
            yield fam
        for name, values in sorted(per_position.items()):  # (vLLM's ..._per_pos{position="i"})
            fam = CounterMetricFamily(_prom_name(name + "_per_pos"), f"engine counter {name}, by position",
                                      labels=["position"])
            for pos, value in sorted(values):
                fam.add_metric([str(pos)], value)
            yield fam
        for name, value in sorted(snap.get("gauges", {}).items()):
            fam = GaugeMetricFamily(_prom_name(name), desc.get(name) or f"engine gauge {name}")
            fam.add_metric([], value)
            yield fam


class ServerMetrics:
    """One prometheus-client registry per server (tests may run several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.ttft = Histogram("deepinfer:time_to_first_token_seconds",
                              "time from arrival to the first generated token", buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("deepinfer:inter_token_latency_seconds",
                             "time between successive generated tokens of a request", buckets=_ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram("deepinfer:e2e_request_latency_seconds",
                             "time from arrival to the last token of a request", buckets=_E2E_BUCKETS, registry=r)
        self.rejected = Counter("deepinfer:http_requests_rejected", "requests refused with 503 (queue full or "
                                "shutting down)", registry=r)
        self.client_aborts = Counter("deepinfer:http_client_disconnects",
                                     "requests aborted because their client went away", registry=r)
        self.errors = Counter("deepinfer:http_request_errors", "requests answered with a 4xx or 5xx",
                              ["status"], registry=r)
        self.engine = _EngineCollector()
        r.register(self.engine)
        self._plugin_hists: dict[str, Histogram] = {}

    def update_engine(self, snapshot: dict[str, Any]) -> None:
        self.engine.snapshot = snapshot
        for name, values in snapshot.get("histograms", {}).items():
            h = self._plugin_hists.get(name)
            if h is None:
                h = Histogram(_prom_name(name), f"engine histogram {name}", registry=self.registry)
                self._plugin_hists[name] = h
            for v in values:
                h.observe(v)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Per-request latency bookkeeping: TTFT once, then one inter-token gap per new token."""

    __slots__ = ("arrival", "last", "metrics")

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.arrival = time.perf_counter()
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last is None:
            self.metrics.ttft.observe(now - self.arrival)
            extra, gap = n - 1, 0.0
        else:
            # several tokens in one delta (a slow reader, or speculation): spread the gap evenly
            extra, gap = n, (now - self.last) / n
        for _ in range(extra):
            self.metrics.itl.observe(gap)
        self.last = now

    def finish(self) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)
