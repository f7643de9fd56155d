"""`deepinfer bench kvstore` on the demo model (CPU, tiny lengths): a row a length, each restore
served from its tier (cached tokens counted by the engine, bytes by the store's own counters), and
the crossover line read off the rows."""
from __future__ import annotations

import glob
import json
import os

import pytest

from deepinfer.bench.kvstore import crossover, parse_lengths
from deepinfer.cli import main


def _row(n: int, recompute: float, host: float, disk: float) -> dict:
    return {"prompt_tokens": n, "recompute_ms": recompute, "host_ms": host, "disk_ms": disk}


def test_crossover_is_the_shortest_length_from_which_loading_stays_faster():
    rows = [_row(512, 10, 12, 30), _row(1024, 20, 15, 25), _row(2048, 40, 20, 45), _row(4096, 80, 30, 70)]
    assert crossover(rows, "host") == 1024
    assert crossover(rows, "disk") == 4096  # (faster at 1024 too, but not at 2048)
    assert crossover([_row(512, 10, 11, 11)], "host") is None


@pytest.mark.parametrize("text", ["", "1,2", "a,64"])
def test_lengths_must_be_numbers_of_two_tokens_or_more(text):
    with pytest.raises(ValueError, match="--lengths"):
        parse_lengths(text)


@pytest.mark.slow
def test_rows_restore_whole_blocks_from_each_tier(tmp_path, capsys):
    out, store = tmp_path / "out.json", tmp_path / "store"
    rc = main(["bench", "kvstore", "--device", "cpu", "--lengths", "40,72", "--repeats", "1", "--dir", str(store),
               "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["prompt_tokens"] for r in rows] == [40, 72]
    for r in rows:
        whole = (r["prompt_tokens"] - 1) // 16 * 16  # every full block but the last token's
        assert r["recompute_cached_tokens"] == 0
        assert r["host_cached_tokens"] == whole and r["disk_cached_tokens"] == whole
        assert 0 < r["host_bytes_read"] <= r["disk_bytes_read"]  # (a block file adds its key, tokens, checksum)
    assert glob.glob(os.path.join(store, "*", "*", "*", "*.kvb"))
    printed = capsys.readouterr().out
    for tier in ("host", "disk"):
        at = crossover(rows, tier)
        assert (f"{tier} restore beats recompute from {at} prompt tokens" if at else
                f"{tier} restore beats recompute at none of these lengths") in printed
