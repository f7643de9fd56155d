"""The dependency rules of DESIGN.md, checked by import-linter's contracts in pyproject.toml."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import tomllib

import deepinfer

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout and "3 kept" in res.stdout


def test_built_in_plugins_may_import_nothing_of_deepinfer_but_its_plugin_api():
    """The contract for deepinfer_builtin forbids every module of deepinfer but deepinfer.plugins (the
    package's own __init__ aside), so a module added to deepinfer is forbidden to plugins from the start."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    builtin = next(c for c in contracts if c["source_modules"] == ["deepinfer_builtin"])
    modules = {f"deepinfer.{m.name}" for m in pkgutil.iter_modules(deepinfer.__path__)}
    assert set(builtin["forbidden_modules"]) == modules - {"deepinfer.plugins"}
