from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker: the workers already fill the cores, and more threads only contend
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 (no usable torch or torch_npu: no such device)
        return False


def _has_npu() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 (no usable torch or torch_npu: no such device)
        return False


def _start_order(item) -> int:
    """Longest first: the modules that run whole engines in the Triton interpreter (minutes each),
    the rest of the slow tier, then the default tier. pytest-xdist deals the collection out in
    this order, so the longest tests start at once instead of last."""
    module = getattr(item, "module", None)
    if module is not None and "run_interpreted" in vars(module):
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_order)  # (stable: the order within each kind is kept)
    gpu = _has_cuda()
    npu = None
    for item in items:
        if item.get_closest_marker("gpu") is not None and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if item.get_closest_marker("ascend") is not None:
            npu = _has_npu() if npu is None else npu
            if not npu:
                item.add_marker(pytest.mark.skip(reason="needs torch_npu and an Ascend NPU"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    from tests.tiny_models import make_model

    path = tmp_path_factory.mktemp("llama")
    model = make_model(path, "llama")
    return path, model


@pytest.fixture(scope="session")
def thirdparty_site(tmp_path_factory):
    """The fixture package tests/fixtures/thirdparty, built and installed into a directory of its own."""
    from tests.thirdparty import install

    return install(tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("build"))
