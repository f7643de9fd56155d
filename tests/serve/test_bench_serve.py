"""`deepinfer bench serve` against the shared server, with the offline comparison."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepinfer.bench.serve_load import make_workload, percentiles
from tests.serve.conftest import API_KEY, ROOT

pytestmark = pytest.mark.slow  # bench serve runs against a real server


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"mean": 50.5, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([7.0])["p99"] == 7.0


def test_workload_is_exact_and_reproducible():
    a = make_workload(5, 12, 3, vocab_size=320, seed=1)
    assert a == make_workload(5, 12, 3, vocab_size=320, seed=1)
    assert all(len(r.prompt_ids) == 12 and r.output_len == 3 for r in a)
    assert all(16 <= t < 320 for r in a for t in r.prompt_ids)


def test_bench_serve_reports_http_and_offline_numbers(server, tiny_model, tmp_path):
    before = server.wait_idle()
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", "serve", str(tiny_model),
                        "--base-url", server.base_url, "--api-key", API_KEY, "--max-model-len", "256",
                        "--num-prompts", "8", "--concurrency", "4", "--input-len", "8", "--output-len", "8",
                        "--ttft-requests", "2", "--offline", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    http = report["http"]
    assert http["requests"] == 8 and http["failed"] == 0
    assert http["output_throughput"] > 0 and 0 < http["ttft_ms"]["p50"] <= http["e2e_ms"]["p50"]
    assert report["offline"]["output_throughput"] > 0
    assert set(report["ratios"]) == {"throughput_http_over_offline", "ttft_p50_overhead_ms",
                                     "ttft_p50_http_over_offline"}
    assert "throughput_http_over_offline" in r.stdout
    after = server.wait_idle()
    # 8 requests of 8 tokens, a 2-token warm-up, and 3 one-token TTFT probes (one warms up)
    generated = after["deepinfer:generation_tokens_total"] - before["deepinfer:generation_tokens_total"]
    assert generated == 8 * 8 + 2 + 3
