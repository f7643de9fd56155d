"""`deepinfer bench swa` on a small hybrid model: rows for every configuration, replay bounded by R
where checkpoints survive, none for prefix-cache alone, the most with no checkpoints."""
from __future__ import annotations

import json
from pathlib import Path

from deepinfer.bench.models import build_random_model
from deepinfer.bench.swa import Conversations
from deepinfer.cli import main


def test_turns_extend_their_conversation_or_branch_off_it():
    work = Conversations(3, 4, 400, 0.5, 1000, seed=1)
    prev = work.prompts(0)
    for turn in range(1, 4):
        work.replies([[7, 7]] * 3)
        now = work.prompts(turn)
        for before, after in zip(prev, now, strict=True):
            full = before + [7, 7]
            shared = next((i for i, (a, b) in enumerate(zip(full, after)) if a != b), min(len(full), len(after)))
            assert shared >= len(full) // 2 and len(after) > shared  # a whole or half-kept history, then new tokens
        prev = now


def test_hybrid_random_models_have_three_sliding_layers_to_one_full(tmp_path):
    path = build_random_model("qwen3-tiny", out=str(tmp_path), hybrid_window=64, max_position_embeddings=512)
    cfg = json.loads((Path(path) / "config.json").read_text())
    assert cfg["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"] and cfg["sliding_window"] == 64


def test_bench_swa_reports_every_configuration(capsys):
    rc = main(["bench", "swa", "--window", "32", "--context", "192", "--turns", "3", "--conversations", "2",
               "--intervals", "32,64", "--output-len", "2", "--device", "cpu", "--num-kv-blocks", "96"])
    assert rc == 0
    rows = {line[:28].strip(): line[28:].split() for line in capsys.readouterr().out.splitlines()[3:]}
    assert list(rows) == ["prefix-cache (baseline)", "swa-replay R=32", "swa-replay R=64",
                          "swa-replay, no checkpoints"]
    replayed = {k: float(v[0]) for k, v in rows.items()}
    assert replayed["prefix-cache (baseline)"] == 0
    assert replayed["swa-replay R=32"] < 32 and replayed["swa-replay R=64"] < 64
    assert replayed["swa-replay, no checkpoints"] > replayed["swa-replay R=64"]
