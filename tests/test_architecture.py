"""The dependency rules of DESIGN.md, checked by import-linter's contracts in pyproject.toml."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout and "3 kept" in res.stdout
