"""A card's ceilings: recorded ones as recorded, any other card measured once and cached by name."""
from __future__ import annotations

import json

import pytest

from deepinfer.bench.ceilings import RECORDED, Ceiling, ceiling_for


def test_an_unrecorded_card_is_measured_once_then_read_from_the_cache(tmp_path):
    path = tmp_path / "sub" / "ceilings.json"
    calls = []

    def measure():
        calls.append(1)
        return Ceiling(1e12, 2e14, "measured 2026-12-07")

    first = ceiling_for("NVIDIA L4", measure, path)
    again = ceiling_for("NVIDIA L4", measure, path)
    assert first == again == Ceiling(1e12, 2e14, "measured 2026-12-07")
    assert len(calls) == 1
    assert json.loads(path.read_text())["NVIDIA L4"]["bf16_flops"] == 2e14
    # another card is measured too, beside the first
    ceiling_for("NVIDIA A100-SXM4-80GB", lambda: Ceiling(2e12, 3e14, "measured"), path)
    assert set(json.loads(path.read_text())) == {"NVIDIA L4", "NVIDIA A100-SXM4-80GB"}


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_recorded_cards_are_never_measured(tmp_path, name):
    def measure():
        raise AssertionError("a recorded card was measured")

    assert ceiling_for(name, measure, tmp_path / "c.json") is RECORDED[name]
    assert not (tmp_path / "c.json").exists()


def test_a_corrupt_cache_says_which_file_to_delete(tmp_path):
    path = tmp_path / "ceilings.json"
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="delete the file"):
        ceiling_for("NVIDIA L4", lambda: Ceiling(1, 1), path)


@pytest.mark.gpu
def test_measured_ceilings_of_this_card_are_plausible():
    import torch

    from deepinfer.bench.ceilings import measure

    got = measure(torch.device("cuda"), seconds=0.2)
    # any CUDA card since 2014 copies faster than 100 GB/s; bf16 runs at over 10 TFLOP/s on
    # the cards that have it, and below 5 PFLOP/s dense on all of them
    assert 1e11 < got.bandwidth < 2e13
    assert 1e13 < got.bf16_flops < 5e15
