"""Every kernel compiles for Hopper (sm_90) down to a cubin, checked on any machine, no GPU needed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # compiles every kernel for sm90 in a subprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
def test_every_kernel_compiles_for_sm90_within_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    res = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert res.stdout.count("compiled ") >= 14  # one per launch in _all_calls


@pytest.mark.subprocess
def test_compiled_kernels_given_cpu_tensors_say_so():
    """In compiled mode (no TRITON_INTERPRET), a kernel given CPU tensors fails with an error that
    names the tensor's device and the way to run on the CPU, whatever Triton itself raised."""
    code = ("import torch, deepinfer_kernels as K\n"
            "try:\n"
            "    K.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6)\n"
            "except ValueError as e:\n"
            "    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "ERR _rms_norm_kernel was given a tensor on cpu" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in res.stdout
