"""DEEPINFER_PLUGINS gates every entry-point group deepinfer loads, model architectures included,
and `plugins list` marks what it leaves out (without importing it)."""
from __future__ import annotations

import json

from tests.plugins.test_thirdparty import _run, site  # noqa: F401 (the installed fixture package)

ALLOWED = "cpu,torch,fcfs,no-cache"
# the fixture's BrokenForCausalLM imports a module that does not exist: importing it fails loudly


def test_an_allow_list_keeps_other_distributions_model_entry_points_unimported(site, tiny_llama):  # noqa: F811
    path, _ = tiny_llama
    code = f"""
import os, sys
os.environ["DEEPINFER_PLUGINS"] = {ALLOWED!r}
from deepinfer import LLM, SamplingParams
llm = LLM({str(path)!r}, progress=False)
out = llm.generate({{"prompt_token_ids": [5, 6]}}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
imported = sorted(m for m in sys.modules if m.startswith("deepinfer_example_plugins"))
print(len(out[0].outputs[0].token_ids), imported)
"""
    res = _run(site, code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "3 []"


def test_plugins_list_marks_what_the_allow_list_excludes(site):  # noqa: F811
    code = f"""
import os, sys, json
os.environ["DEEPINFER_PLUGINS"] = {ALLOWED!r}
from deepinfer.plugins.status import plugin_statuses
rows = {{r.name: r.status for r in plugin_statuses()}}
print(json.dumps({{"rows": rows, "imported": sorted(m for m in sys.modules if m.startswith("deepinfer_example"))}}))
"""
    res = _run(site, code)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    rows = out["rows"]
    for name in ("BrokenForCausalLM", "example-counter", "example-observer", "example-probe", "prefix-cache"):
        assert rows[name] == "excluded by DEEPINFER_PLUGINS (not imported)", (name, rows[name])
    for name in ("cpu", "torch", "fcfs", "no-cache", "LlamaForCausalLM"):
        assert rows[name] == "ok", (name, rows[name])
    assert out["imported"] == []
