"""The MoE bench script's own code runs end to end (tiny shapes, untimed), so it cannot rot unseen."""
from __future__ import annotations

import pytest
import torch

from deepinfer.bench import kernels as bench_kernels
from deepinfer.bench import moe_kernels


@pytest.mark.slow
def test_moe_bench_checks_both_kernels_on_tiny_shapes(monkeypatch, device):
    monkeypatch.setattr(bench_kernels, "DEV", device)
    if device == "cpu":  # the interpreter computes bfloat16 wrongly
        monkeypatch.setattr(bench_kernels, "BF16", torch.float16)
    monkeypatch.setattr(bench_kernels, "time_ms", lambda fn, ms: (fn(), 1.0)[1])
    monkeypatch.setattr(moe_kernels, "MEMORY_BOUND_TOKENS", 1)  # so that 2 tokens take the FLOPs branch
    table = bench_kernels.Table()
    moe_kernels.bench_moe(table, 1, 32, 32, 8, 2, 1)  # reported as bandwidth
    moe_kernels.bench_moe(table, 2, 32, 32, 8, 2, 1)  # as FLOPs
    moe_kernels.bench_routing(table, 16, 16, 3, 1, scoring="sigmoid", n_group=4, topk_group=2, renormalize=True)
    assert not table.failed, table.markdown()
    text = table.markdown()
    assert text.count("| ok |") == 3 and "TB/s" in text and "TFLOP/s" in text


def test_moe_bench_arguments_parse_and_it_refuses_to_run_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("with a GPU the script would run for real")
    assert moe_kernels.main(["--out", str(tmp_path), "--quick", "--tokens", "1", "64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        moe_kernels.main(["--tokens", "1"])  # --out is required
