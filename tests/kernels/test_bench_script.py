"""The GPU check script's own code runs end to end (tiny shapes, untimed), so it cannot rot unseen."""
from __future__ import annotations

import torch

from deepinfer.bench import kernels as bench_kernels


def test_bench_script_checks_every_kernel_on_tiny_shapes(monkeypatch, device):
    monkeypatch.setattr(bench_kernels, "DEV", device)
    if device == "cpu":  # the interpreter computes bfloat16 wrongly
        monkeypatch.setattr(bench_kernels, "BF16", torch.float16)
    monkeypatch.setattr(bench_kernels, "time_ms", lambda fn, ms: (fn(), 1.0)[1])
    table = bench_kernels.Table()
    bench_kernels.bench_decode(table, 2, 40, 4, 2, 16, 17, 1)
    bench_kernels.bench_prefill(table, 2, 20, 12, 4, 2, 16, 7, 1)
    bench_kernels.bench_elementwise(table, 4, 1)
    bench_kernels.bench_single_token(table, 32, 48, 4, 2, 8, 300, 1)
    assert not table.failed, table.markdown()
    assert len(table.rows) == 12 and table.markdown().count("| ok |") == 12
