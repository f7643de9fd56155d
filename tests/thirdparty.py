"""The third-party fixture package (tests/fixtures/thirdparty), installed as an outside author's
package would be, and commands run with it importable."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "thirdparty"
ROOT = Path(__file__).resolve().parents[1]


def install(target: Path, build: Path) -> Path:
    """Build and install the fixture package into ``target`` (not the test venv)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--target", str(target), str(FIXTURE)],
                   check=True, cwd=build, capture_output=True)
    return target


def env_with(site: Path, **extra: str) -> dict[str, str]:
    """This environment with the fixture package importable (and the venv's scripts on PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPINFER_PLUGINS", "DEEPINFER_DEBUG")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), **extra)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_code(site: Path, code: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env_with(site, **extra), capture_output=True,
                          text=True, timeout=300, check=False)


def run_cli(site: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.cli", *args], env=env_with(site, **extra),
                          capture_output=True, text=True, timeout=300, check=False)
