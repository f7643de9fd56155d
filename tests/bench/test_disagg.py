"""`deepinfer bench disagg` on the demo model (CPU, tiny sizes): a colocated instance, then prefill
and decode instances behind the router; both rows, the ratios read off them, and the decode
instance taking the prompts' KV from the store."""
from __future__ import annotations

import json

import pytest

from deepinfer.bench.disagg import engine_flags
from deepinfer.cli import main


def test_engine_flags_leave_the_policy_to_the_bench():
    flags = engine_flags(None, {"model": "m", "plugins": ["prefix-cache"], "plugin_options": {"x": {}},
                                "device": "cpu", "kv_cache_memory_gb": 16.0, "cuda_graph_sizes": [1, 2]})
    assert flags == ["--device", "cpu", "--kv-cache-memory-gb", "16.0", "--cuda-graph-sizes", "1,2"]


@pytest.mark.slow
def test_rows_ratios_and_the_hand_over(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["bench", "disagg", "--device", "cpu", "--num-prompts", "3", "--concurrency", "2", "--input-len", "48",
               "--output-len", "4", "--dir", str(tmp_path / "kv"), "--json", str(out)])
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"colocated", "disaggregated"}
    co, dis = rows["colocated"], rows["disaggregated"]
    assert co["failed"] == dis["failed"] == 0 and co["requests"] == dis["requests"] == 3
    printed = capsys.readouterr().out
    assert (f"disaggregated / colocated: output tok/s {dis['output_throughput'] / co['output_throughput']:.3f}, "
            f"TTFT p50 {dis['ttft_ms']['p50'] / co['ttft_ms']['p50']:.3f}") in printed
    # every request's prompt (48 tokens: 2 whole blocks before its last token) read from the store
    assert dis["decode_store_blocks"] >= 3 * 2
    assert dis["decode_prefix_hits"] >= 3 * 32
