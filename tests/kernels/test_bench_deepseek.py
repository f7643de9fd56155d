"""The DeepSeek kernels' GPU check script runs end to end on tiny shapes (untimed), so it cannot rot unseen."""
from __future__ import annotations

import pytest
import torch

from deepinfer.bench import kernels as base
from deepinfer.bench import kernels_deepseek as bench


def test_deepseek_bench_checks_both_kernels_on_tiny_shapes(monkeypatch, device):
    monkeypatch.setattr(base, "DEV", device)
    if device == "cpu":  # the interpreter computes bfloat16 wrongly
        monkeypatch.setattr(base, "BF16", torch.float16)
    monkeypatch.setattr(base, "time_ms", lambda fn, ms: (fn(), 1.0)[1])
    table = base.Table()
    bench.bench_mla_decode(table, 2, 40, 4, 1, d=48, dv=32, block_size=4)
    bench.bench_fp8_gemm(table, 3, 200, 300, "tiny", 1)
    assert not table.failed, table.markdown()
    assert len(table.rows) == 2 and table.markdown().count("| ok |") == 2


def test_deepseek_bench_parses_its_arguments_and_says_what_it_needs(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("on a GPU main() runs the whole bench")
    assert bench.main(["--out", str(tmp_path), "--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
