"""The command line: plugins list, generate, config precedence."""
from __future__ import annotations

import json
import subprocess
import sys

from deepinfer.core.config import build_config


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, check=False)


def test_plugins_list_shows_builtins_ok():
    res = _cli("plugins", "list")
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    for name, slot in [("cpu", "device"), ("torch", "attention"), ("fcfs", "scheduler"), ("no-cache", "cache_policy"),
                       ("prefix-cache", "cache_policy"), ("eplb", "hooks")]:
        assert name in lines and slot in lines[name] and lines[name].rstrip().endswith("ok"), lines.get(name)
        assert "deepinfer 0.1.0" in lines[name]
    # on a machine without an NVIDIA GPU or torch-npu, those plugins say why they cannot load
    import torch

    if not torch.cuda.is_available():
        for name in ("sm90", "sm100"):
            assert not lines[name].rstrip().endswith(" ok")
            assert "CUDA" in lines[name] or "GPU" in lines[name]
    for name in ("draft-model", "deepspark", "ngram"):
        assert lines[name].rstrip().endswith("ok")


def test_generate_prints_the_greedy_text(tiny_llama):
    from deepinfer import LLM, SamplingParams

    path, _ = tiny_llama
    res = _cli("generate", str(path), "--prompt", "import os", "--max-tokens", "8", "--ignore-eos", "--json",
               "--plugins", "prefix-cache")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    ref = LLM(str(path), progress=False).generate("import os", SamplingParams(temperature=0, max_tokens=8,
                                                                              ignore_eos=True), use_tqdm=False)
    assert got["token_ids"] == ref[0].outputs[0].token_ids and got["text"] == ref[0].outputs[0].text


def test_cli_reports_bad_input_without_traceback(tmp_path):
    res = _cli("generate", str(tmp_path), "--prompt", "x")
    assert res.returncode == 2
    assert "has no config.json" in res.stderr and "Traceback" not in res.stderr


def test_config_precedence_defaults_file_env_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seqs: 7\nblock_size: 8\nplugins: [no-cache]\nfcfs:\n  long_prefill_token_threshold: 5\n")
    c = build_config(str(cfg), {"block_size": 32}, environ={"DEEPINFER_MAX_NUM_SEQS": "9"})
    assert (c.max_num_seqs, c.block_size, c.plugins) == (9, 32, ["no-cache"])
    assert c.plugin_options == {"fcfs": {"long_prefill_token_threshold": 5}}
    toml = tmp_path / "c.toml"
    toml.write_text('plugins = "no-cache"\nmax_model_len = 64\n')
    assert build_config(str(toml), environ={}).max_model_len == 64


def test_config_file_with_unknown_scalar_key_is_refused(tmp_path):
    import pytest

    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seq: 7\n")
    with pytest.raises(ValueError, match="unknown option 'max_num_seq'; valid options: .*max_num_seqs"):
        build_config(str(cfg), environ={})


def test_train_demo_is_reachable_from_the_cli():
    res = _cli("train-demo", "--help")
    assert res.returncode == 0, res.stderr
    assert "--quick" in res.stdout and "--device" in res.stdout


def test_plugin_options_merge_option_by_option_across_sources(tmp_path):
    """A file's plugin section, the environment and keyword arguments each change only the options
    they name: later sources win option by option."""
    from deepinfer.core.config import build_config

    cfg = tmp_path / "run.yaml"
    cfg.write_text("fcfs:\n  overlap: false\n  long_prefill_token_threshold: 64\nplugin_options:\n"
                   "  prefix-cache:\n    a: 1\n")
    env = {"DEEPINFER_PLUGIN_OPTIONS": '{"fcfs": {"long_prefill_token_threshold": 32}, "prefix-cache": {"b": 2}}'}
    c = build_config(str(cfg), {"plugin_options": {"fcfs": {"overlap": True}}}, environ=env)
    assert c.plugin_options == {"fcfs": {"overlap": True, "long_prefill_token_threshold": 32},
                                "prefix-cache": {"a": 1, "b": 2}}
