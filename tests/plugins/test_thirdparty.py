"""The path a third party takes: its own package, its own entry points, selected by name."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.thirdparty import run_code


@pytest.fixture(scope="module")
def site(thirdparty_site):
    return thirdparty_site


def _run(site: Path, code: str) -> subprocess.CompletedProcess:
    return run_code(site, code)


def test_installed_plugin_is_selected_and_runs(site, tiny_llama):
    path, _ = tiny_llama
    code = f"""
import json
from deepinfer import LLM, SamplingParams
import deepinfer_example_plugins.observer as obs
llm = LLM({str(path)!r}, plugins=["example-counter", "example-observer"],
          plugin_options={{"example-counter": {{"weight": 3}}}}, block_size=4, progress=False)
llm.generate([{{"prompt_token_ids": [5, 6, 7]}}] * 2, SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
m = llm.get_metrics()
llm.engine.add_request("left-running", [5, 6], SamplingParams(max_tokens=50))
llm.engine.step()
with llm:
    pass
llm.engine.kv.pool.check_all_free()
print(json.dumps({{"freed": m["deepinfer:example_freed_blocks"], "ready": m["deepinfer:example_observer_ready"],
                  "finished": len(obs.FINISHED), "plugins": llm.engine.plugin_names, "stopped": obs.STOPPED}}))
"""
    res = _run(site, code)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # each request holds KV for 3 prompt + 5 fed-back tokens (the 6th is sampled, never fed)
    # -> ceil(8 / 4) = 2 blocks, weighted 3
    assert out["freed"] == 2 * 2 * 3
    assert out["ready"] == 1 and out["finished"] == 2
    assert out["plugins"]["cache_policy"] == ["example-counter"]
    assert out["stopped"] == [False]  # shutdown aborted the running request before the hook


def test_plugin_that_fails_to_import_is_named_with_its_distribution(site, tiny_llama):
    path, _ = tiny_llama
    res = _run(site, f"from deepinfer import LLM; LLM({str(path)!r}, plugins=['example-broken'], progress=False)")
    assert res.returncode != 0
    assert "example-broken" in res.stderr and "deepinfer-example-plugins 0.0.1" in res.stderr
    assert "deepinfer_example_missing_dependency" in res.stderr


def test_plugins_list_shows_third_party_plugins_and_why_one_cannot_load(site):
    res = _run(site, "from deepinfer.cli import main; main(['plugins', 'list', '--json'])")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["example-counter"]["status"] == "ok"
    assert rows["example-counter"]["distribution"] == "deepinfer-example-plugins 0.0.1"
    assert rows["example-draft"]["status"] == "ok" and rows["example-draft"]["slot"] == "drafter"
    assert "failed to load" in rows["example-broken"]["status"]
    assert rows["example-probe"]["status"] == "availability check failed: RuntimeError: probe exploded"
    assert rows["BrokenForCausalLM"]["slot"] == "model"
    assert "deepinfer_example_missing_dependency" in rows["BrokenForCausalLM"]["status"]
    assert rows["LlamaForCausalLM"]["status"] == "ok"


def test_a_broken_model_plugin_fails_only_models_of_its_architecture(site, tiny_llama, tmp_path):
    """The fixture's BrokenForCausalLM cannot import: a Llama still runs (with device auto, which
    passes over example-probe, whose check raises), and a model of that architecture fails naming it."""
    import shutil

    path, _ = tiny_llama
    broken = tmp_path / "broken-model"
    shutil.copytree(path, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["BrokenForCausalLM"]}))
    code = f"""
from deepinfer import LLM, SamplingParams
llm = LLM({str(path)!r}, progress=False)
out = llm.generate({{"prompt_token_ids": [5, 6]}}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
print(llm.engine.plugin_names["device"], len(out[0].outputs[0].token_ids))
try:
    LLM({str(broken)!r}, progress=False)
except Exception as e:
    print(type(e).__name__, e)
"""
    res = _run(site, code)
    assert res.returncode == 0, res.stderr
    ran, failed = res.stdout.strip().splitlines()[-2:]
    assert ran == "['cpu'] 3"
    assert failed.startswith("UnsupportedArchitectureError model plugin 'BrokenForCausalLM'")
    assert "deepinfer_example_missing_dependency" in failed


def test_allow_list_hides_everything_else(site, tiny_llama):
    path, _ = tiny_llama
    env_code = f"""
import os
os.environ["DEEPINFER_PLUGINS"] = "cpu,torch,fcfs,no-cache"
from deepinfer import LLM
try:
    LLM({str(path)!r}, plugins=["example-counter"], progress=False)
except Exception as e:
    print(type(e).__name__, e)
"""
    res = _run(site, env_code)
    assert "unknown plugin 'example-counter'" in res.stdout and "DEEPINFER_PLUGINS allows only" in res.stdout


def test_two_plugins_for_one_exclusive_slot_are_refused(site, tiny_llama):
    path, _ = tiny_llama
    res = _run(site, f"from deepinfer import LLM; LLM({str(path)!r}, plugins=['cpu', 'example-host'], progress=False)")
    assert res.returncode != 0
    assert "two plugins for the device slot, which takes one: 'cpu' and 'example-host'" in res.stderr


def test_third_party_device_can_be_chosen_explicitly(site, tiny_llama):
    path, _ = tiny_llama
    code = f"""
from deepinfer import LLM, SamplingParams
llm = LLM({str(path)!r}, device="example-host", progress=False)
out = llm.generate({{"prompt_token_ids": [5, 6]}}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
print(llm.engine.plugin_names["device"], len(out[0].outputs[0].token_ids))
"""
    res = _run(site, code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "['example-host'] 3"
