"""Fallback: when triton was imported in this process before TRITON_INTERPRET=1 could be set (and
there is no GPU), the kernel tests run again in a fresh process, where conftest sets it first."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.conftest import IN_PROCESS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(IN_PROCESS, reason="the kernel tests run in this process")
def test_kernel_tests_pass_in_a_fresh_interpreter_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels",
                          "--ignore", "tests/kernels/test_sm90_compile.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
