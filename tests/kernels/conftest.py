"""Kernel tests run compiled on a GPU when there is one, else in the Triton interpreter on the CPU.

Triton reads TRITON_INTERPRET once, when triton.language is first imported, so it is set here,
at collection, before any test imports triton. If something in this process imported triton
earlier (compiled mode, no GPU), the tests here are skipped and test_interpreter_subprocess.py
runs this directory again in a fresh process with the variable set.
"""
from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import deepinfer_kernels

#: the kernels can run in this process: compiled on the GPU, or interpreted on the CPU
IN_PROCESS = CUDA or deepinfer_kernels.triton_interpreted()
DEVICE = "cuda" if CUDA else "cpu"


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess: runs its own process; needs no kernels in this one")


@pytest.fixture(autouse=True)
def _kernels_runnable(request):
    if not IN_PROCESS and "subprocess" not in request.keywords:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; "
                    "test_interpreter_subprocess.py runs these tests in a fresh process")


@pytest.fixture
def device() -> str:
    return DEVICE
