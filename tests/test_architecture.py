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


def test_plugins_import_only_the_public_names_of_deepinfer_plugins():
    """The built-in plugins and the third-party fixture package import deepinfer.plugins' own names
    (``__all__``), never its machinery (discovery, groups, selection), which import-linter allows."""
    for root in (ROOT / "plugins_builtin", ROOT / "tests" / "fixtures" / "thirdparty"):
        found = _plugin_api_imports(root)
        assert set(found) <= {"deepinfer.plugins"}, (root, found)
        assert found.get("deepinfer.plugins", set()) <= set(deepinfer.plugins.__all__), root


def test_every_public_name_is_in_the_reference_of_writing_a_plugin():
    """docs/writing-a-plugin.md's table under "The API" lists exactly deepinfer.plugins' names."""
    doc = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    section = doc[doc.index("## The API"):]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert sorted(listed) == sorted(deepinfer.plugins.__all__)
    # (the target: about 20 names; 21 for the slots, 7 more for optional capabilities, 2 for
    # what a model may offer a hook plugin: its expert load and expert placement)
    assert len(listed) <= 30
