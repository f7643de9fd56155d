"""`deepinfer generate --metrics`: the engine's metrics (plugins' own included) after the outputs."""
from __future__ import annotations

import json

import pytest

from tests.thirdparty import run_cli


def test_json_metrics_count_what_was_generated(tiny_llama, capsys):
    from deepinfer.cli import main

    path, _ = tiny_llama
    rc = main(["generate", str(path), "--prompt", "a", "--prompt", "b", "--max-tokens", "5", "--ignore-eos",
               "--json", "--metrics"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    outputs, metrics = lines[:-1], lines[-1]["metrics"]
    assert len(outputs) == 2 and all(len(o["token_ids"]) == 5 for o in outputs)
    assert metrics["deepinfer:generation_tokens"] == 10 and metrics["deepinfer:request_success"] == 2


def test_text_metrics_follow_the_texts(tiny_llama, capsys):
    from deepinfer.cli import main

    path, _ = tiny_llama
    assert main(["generate", str(path), "--prompt", "a", "--max-tokens", "3", "--ignore-eos", "--metrics"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index("# metrics")
    metrics = dict(line.rsplit(" ", 1) for line in out[head + 1:])
    assert metrics["deepinfer:generation_tokens"] == "3" and metrics["deepinfer:request_success"] == "1"


@pytest.mark.slow
def test_a_plugins_metrics_show_on_the_command_line(thirdparty_site, tiny_llama):
    path, _ = tiny_llama
    res = run_cli(thirdparty_site, "generate", str(path), "--plugins", "example-counter,example-observer",
                  "--block-size", "4", "--prompt", "a b", "--max-tokens", "6", "--ignore-eos", "--json", "--metrics")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    metrics = lines[-1]["metrics"]
    prompt_len = metrics["deepinfer:prompt_tokens"]
    # the request held KV for its prompt and 5 fed-back tokens: ceil((prompt + 5) / 4) blocks freed
    assert metrics["deepinfer:example_freed_blocks"] == -(-(prompt_len + 5) // 4)
    assert metrics["deepinfer:example_observer_ready"] == 1
