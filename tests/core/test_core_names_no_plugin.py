"""The core asks for capabilities, never for a plugin by name: no string of a core module (messages,
docstrings, defaults) names a built-in plugin. Oracle: the built-ins' entry points in pyproject.toml.
``torch`` and ``cpu`` are left out: they are also the library's and the device type's names (the
base Device's ``default_attention = "torch"`` is a default every built-in device overrides)."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
GENERIC = {"torch", "cpu"}


def _builtin_names() -> set[str]:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    return {name for group, eps in groups.items() if group != "deepinfer.models"
            for name, target in eps.items() if target.startswith("deepinfer_builtin.")} - GENERIC


def _strings(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    kinds = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # (f-strings from 3.12)
    return [(t.start[0], t.string) for t in tokens if t.type in kinds]


def test_no_string_of_a_core_module_names_a_built_in_plugin():
    names = _builtin_names()
    assert {"swa-replay", "triton", "deepspark", "fcfs"} <= names
    word = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names))) + r")(?![\w-])")
    found = [f"{path.relative_to(ROOT)}:{line}: {m.group(0)}"
             for path in sorted((ROOT / "deepinfer" / "core").glob("*.py"))
             for line, text in _strings(path) for m in word.finditer(text)]
    assert found == []
