"""Every `bench` subcommand writes --json FILE, says each run's progress on stderr as it ends, and
flushes its table line by line into a pipe or file."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepinfer.cli import build_parser

CPU = ("--device", "cpu", "--repeats", "1")


def test_every_bench_subcommand_takes_json_file():
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    subs = bench._subparsers._group_actions[0].choices
    missing = [name for name, p in subs.items() if "--json" not in p._option_string_actions]
    assert missing == []
    assert "--json-out" in subs["serve"]._option_string_actions  # (bench serve's older name for it, kept)


def _bench(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", *args, "--json", str(out)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, json.loads(out.read_text())


@pytest.mark.slow
def test_prefill_json_and_progress(tmp_path):
    res, got = _bench(tmp_path, "prefill", "--random-model", "llama-tiny", "--batch", "2", "--input-len", "16", *CPU)
    assert got["command"] == "prefill" and got["args"]["input_len"] == 16
    (row,) = got["results"]
    assert row["prompt_tokens"] == 32 and row["prompt_tok_s"] == pytest.approx(32 / row["median_s"])
    assert f"{row['prompt_tok_s']:,.0f} tok/s" in res.stdout
    assert res.stderr.count("[bench] prefill run") == 1


@pytest.mark.slow
def test_prefix_json_rows_are_the_table(tmp_path):
    res, got = _bench(tmp_path, "prefix", "--random-model", "llama-tiny", "--shared", "64", "--unique", "16",
                      "--num-requests", "2", "--lookup-blocks", "0", *CPU)
    rows = {r["name"]: r for r in got["results"]}
    assert list(rows) == ["no cache", "prefix-cache"]
    assert rows["no cache"]["hits"] == 0 and rows["prefix-cache"]["hits"] > 0
    assert all(r["prompt_tokens"] == 2 * 80 for r in rows.values())
    assert res.stderr.count("[bench] prefix ") == 2


@pytest.mark.slow
def test_spec_json_rows_and_a_progress_line_per_run(tmp_path):
    res, got = _bench(tmp_path, "spec", "--drafters", "none,ngram", "--batch", "1", "--prompts", "1",
                      "--input-len", "16", "--output-len", "8", "--repeats", "2", "--device", "cpu")
    assert [(r["drafter"], r["batch"]) for r in got["results"]] == [("none", 1), ("ngram", 1)]
    table = res.stdout.splitlines()[2:]
    for r, line in zip(got["results"], table, strict=True):
        assert line.split()[:4] == [r["drafter"], "1", f"{r['seconds']:.2f}", f"{r['tok_s']:.1f}"]
    assert res.stderr.count("[bench] spec none batch 1:") == 2 and res.stderr.count("[bench] spec ngram batch 1:") == 2


@pytest.mark.slow
def test_swa_json_rows(tmp_path):
    _, got = _bench(tmp_path, "swa", "--window", "32", "--context", "128", "--turns", "2", "--conversations", "2",
                    "--intervals", "32", "--output-len", "2", "--device", "cpu", "--num-kv-blocks", "64")
    assert [r["name"] for r in got["results"]] == ["prefix-cache (baseline)", "swa-replay R=32",
                                                   "swa-replay, no checkpoints"]
    assert all(r["requests"] == 4 for r in got["results"])


@pytest.mark.slow
def test_bench_output_is_line_buffered_into_a_pipe():
    code = ("import sys; from deepinfer.cli import main; "
            "main(['bench', 'prefill', '--random-model', 'llama-tiny', '--batch', '1', '--input-len', '8', "
            "'--device', 'cpu', '--repeats', '1']); print(sys.stdout.line_buffering, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == "True"
