"""The ascend device on machines without an NPU: how it reports itself, refuses, and stays unimported."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from deepinfer_builtin.devices.ascend import device
from deepinfer_builtin.devices.ascend.device import parse_cann, reason_from_facts
from deepinfer_builtin.devices.ascend.ops import INSTALL_HINT

ROOT = Path(__file__).resolve().parents[3]
no_torch_npu = pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                                  reason="torch_npu is installed here")


@no_torch_npu
def test_plugins_list_shows_ascend_and_the_reason_it_cannot_load(capsys):
    from deepinfer.cli import main

    assert main(["plugins", "list", "--json"]) == 0
    rows = {(r["name"], r["slot"]): r["status"] for r in json.loads(capsys.readouterr().out)}
    assert rows[("ascend", "device")] == INSTALL_HINT
    assert rows[("ascend-attention", "attention")] == INSTALL_HINT
    assert main(["plugins", "list"]) == 0
    table = capsys.readouterr().out
    assert "pip install deepinfer[ascend]" in table and "CANN" in table


@no_torch_npu
@pytest.mark.parametrize("how", [{"device": "ascend"}, {"plugins": ["ascend"]}])
def test_selecting_ascend_without_torch_npu_names_the_package_and_the_extra(qwen3_swa, how):
    from deepinfer import LLM
    from deepinfer.plugins import PluginError

    with pytest.raises(PluginError) as err:
        LLM(qwen3_swa, progress=False, **how)
    msg = str(err.value)
    assert "device plugin 'ascend' cannot run here" in msg
    assert "torch_npu is not installed" in msg and "pip install deepinfer[ascend]" in msg


@pytest.mark.parametrize(("facts", "expected"), [
    ({"available": True, "count": 8, "soc": "Ascend910B3", "cann": "8.3.RC1"}, None),
    ({"available": True, "count": 16, "soc": "Ascend910_9391", "cann": "8.5.0"}, None),
    ({"available": True, "count": 8, "soc": "Ascend950PR_9579", "cann": "9.0.0"}, None),
    ({"available": True, "count": 8, "soc": "Ascend950DT_95A", "cann": "8.5.0"},
     "Ascend 950 needs CANN 9.0 or newer; this machine has 8.5.0"),
    ({"available": True, "count": 8, "soc": "Ascend910B1", "cann": "8.2.RC1"},
     "Ascend 910B (Atlas A2) needs CANN 8.3 or newer; this machine has 8.2.RC1"),
    ({"available": True, "count": 1, "soc": "Ascend310P3", "cann": "8.3.RC1"},
     ("NPU 0 is 'Ascend310P3', which this plugin does not support; supported: Ascend 950, "
      "Ascend 910C (Atlas A3), Ascend 910B (Atlas A2)")),
    ({"available": True, "count": 1, "soc": "Ascend910B2", "cann": None},
     "cannot tell the CANN version (got None); Ascend 910B (Atlas A2) needs CANN 8.3 or newer"),
    ({"available": False, "count": 0}, ("no Ascend NPU is visible (torch.npu.is_available() is False); "
                                        "check the driver and ASCEND_RT_VISIBLE_DEVICES")),
])
def test_soc_and_cann_decide_whether_the_device_can_run(facts, expected):
    assert reason_from_facts(facts) == expected


def test_cann_versions_parse_by_major_and_minor():
    assert parse_cann("8.3.RC1") == (8, 3) and parse_cann("9.0.0") == (9, 0) and parse_cann("8.5.0.alpha001") == (8, 5)
    assert parse_cann("") is None and parse_cann(None) is None and parse_cann("unknown") is None


FAKE_TORCH_NPU = '''
"""A fake torch_npu for tests: records who imported it; SoC and CANN come from the environment."""
import os
import types

import torch

with open(os.environ["FAKE_NPU_MARKS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
if os.environ.get("FAKE_NPU_FAIL"):
    raise RuntimeError(os.environ["FAKE_NPU_FAIL"])
__version__ = "0.0.0+fake"
npu = types.SimpleNamespace(get_device_name=lambda i=0: os.environ["FAKE_NPU_SOC"])
torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
torch.version.cann = os.environ["FAKE_CANN"]
'''

PARENT = """
import json, os, sys
from deepinfer import LLM, SamplingParams
from deepinfer.plugins.status import plugin_statuses
rows = {(r.name, r.slot): r.status for r in plugin_statuses()}
llm = LLM(sys.argv[1], device="cpu", progress=False)
llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2), use_tqdm=False)
print(json.dumps({"imported": "torch_npu" in sys.modules, "pid": os.getpid(),
                  "device": rows[("ascend", "device")], "attention": rows[("ascend-attention", "attention")]}))
"""


def _fake_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH_NPU))
    return site


def _with_fake_torch_npu(tmp_path: Path, model: str, **env: str) -> tuple[dict, list[int]]:
    site = _fake_site(tmp_path)
    marks = tmp_path / "marks"
    marks.touch()
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "FAKE_NPU_MARKS": str(marks),
                "FAKE_NPU_SOC": "Ascend910B3", "FAKE_CANN": "8.3.RC1", **env}
    full_env.pop("DEEPINFER_PLUGINS", None)
    res = subprocess.run([sys.executable, "-c", PARENT, model], env=full_env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), [int(p) for p in marks.read_text().split()]


def test_listing_plugins_and_a_cpu_engine_never_import_torch_npu(tmp_path, qwen3_swa):
    # a fake torch_npu is importable, so "not imported" means deepinfer chose not to import it
    out, importers = _with_fake_torch_npu(tmp_path, qwen3_swa)
    assert out["imported"] is False and out["pid"] not in importers
    assert len(importers) == 1  # the availability probe, in its own child process
    assert out["device"] == "ok" and out["attention"] == "ok"


def _probe_with_fake_torch_npu(tmp_path: Path, monkeypatch, **env: str) -> str | None:
    """The availability probe, run as usual in a child process that sees a fake torch_npu."""
    site = _fake_site(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    for key, value in {"FAKE_NPU_MARKS": str(tmp_path / "marks"), "FAKE_NPU_SOC": "Ascend910B3",
                       "FAKE_CANN": "8.3.RC1", **env}.items():
        monkeypatch.setenv(key, value)
    device.probe_facts.cache_clear()
    try:
        return reason_from_facts(device.probe_facts())
    finally:
        device.probe_facts.cache_clear()


def test_a_torch_npu_that_fails_to_import_is_reported_not_raised(tmp_path, monkeypatch):
    reason = _probe_with_fake_torch_npu(tmp_path, monkeypatch, FAKE_NPU_FAIL="libascendcl.so: cannot open shared object")
    assert reason == ("importing torch_npu failed: RuntimeError: libascendcl.so: cannot open shared object "
                      "(is the CANN toolkit installed and its set_env.sh sourced?)")
    assert "torch_npu" not in sys.modules


def test_an_unsupported_soc_is_refused_by_name(tmp_path, monkeypatch):
    reason = _probe_with_fake_torch_npu(tmp_path, monkeypatch, FAKE_NPU_SOC="Ascend310P3")
    assert reason.startswith("NPU 0 is 'Ascend310P3', which this plugin does not support")


@pytest.mark.parametrize(("given", "expected"), [({}, 128), ({"block_size": 256}, 256), ({"block_size": 16}, 16)])
def test_block_size_defaults_to_128_unless_given(monkeypatch, given, expected):
    from deepinfer.core.config import EngineConfig
    from deepinfer.core.metrics import Metrics
    from deepinfer.plugins import EngineContext
    from deepinfer_builtin.devices.ascend.device import AscendDevice, AscendOptions

    fake = SimpleNamespace(npu=SimpleNamespace(set_device=lambda index: None))
    monkeypatch.setattr(device, "import_torch_npu", lambda: fake)
    ctx = EngineContext(config=EngineConfig(**given), metrics=Metrics())
    AscendDevice(AscendOptions(), ctx)
    assert ctx.config.block_size == expected  # an explicit 16 stays, for the attention backend to refuse
