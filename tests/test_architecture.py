"""The dependency rules of DESIGN.md, checked by import-linter's contracts in pyproject.toml."""
from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import tomllib

import deepinfer
import deepinfer.plugins
import deepinfer.plugins.capabilities

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


def _plugin_api_imports(root: Path) -> dict[str, set[str]]:
    """What the Python files under ``root`` import of deepinfer.plugins: module -> names (a
    submodule of deepinfer.plugins counts as a module of its own)."""
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("deepinfer.plugins"):
                found.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                found.update({a.name: set() for a in node.names if a.name.startswith("deepinfer.plugins")})
    return found


API = {"deepinfer.plugins": deepinfer.plugins.__all__,
       "deepinfer.plugins.capabilities": deepinfer.plugins.capabilities.__all__}


def test_plugins_import_only_the_public_names_of_deepinfer_plugins():
    """The built-in plugins and the third-party fixture package import the public names (``__all__``)
    of deepinfer.plugins and deepinfer.plugins.capabilities, never the machinery (discovery, groups,
    selection), which import-linter allows."""
    for root in (ROOT / "plugins_builtin", ROOT / "tests" / "fixtures" / "thirdparty"):
        found = _plugin_api_imports(root)
        assert set(found) <= set(API), (root, found)
        for module, names in found.items():
            assert names <= set(API[module]), (root, module, names - set(API[module]))


def test_every_public_name_is_in_the_reference_of_writing_a_plugin():
    """docs/writing-a-plugin.md's two tables under "The API" list exactly deepinfer.plugins' names
    and deepinfer.plugins.capabilities' names."""
    doc = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    section = doc[doc.index("## The API"):]
    core, optional = section.split("| `deepinfer.plugins.capabilities` |")
    assert sorted(re.findall(r"^\| `(\w+)` \|", core, re.MULTILINE)) == sorted(deepinfer.plugins.__all__)
    assert sorted(re.findall(r"^\| `(\w+)` \|", optional, re.MULTILINE)) == sorted(API["deepinfer.plugins.capabilities"])
    # (the target: about 20 names for the slots and what they pass around)
    assert len(deepinfer.plugins.__all__) <= 21
