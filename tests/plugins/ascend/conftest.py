from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.tiny_models import hybrid, make_model

HERE = Path(__file__).parent

NPU_SKIP_REASON = "needs torch_npu and an Ascend NPU"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Undo tests/conftest.py's NPU skip for tests here that are not marked `ascend`.

    It tests ``"ascend" in item.keywords``, and keywords hold the names of the parent packages, so
    every test under tests/plugins/ascend/ matches; only the `ascend` marker should.
    """
    for item in items:
        if item.path.is_relative_to(HERE) and item.get_closest_marker("ascend") is None:
            item.own_markers[:] = [m for m in item.own_markers
                                   if not (m.name == "skip" and m.kwargs.get("reason") == NPU_SKIP_REASON)]


ENTRY_POINTS = """[deepinfer.attention]
ascend-standin = tests.plugins.ascend.standin_plugin:StandinAscendAttention
"""


@pytest.fixture(scope="module")
def standin_registered(tmp_path_factory):
    """Register `ascend-standin` as an attention plugin for one module: a dist-info on sys.path."""
    site = tmp_path_factory.mktemp("standin_site")
    info = site / "deepinfer_ascend_standin-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepinfer-ascend-standin\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.append(str(site))
    yield
    sys.path.remove(str(site))


@pytest.fixture(scope="module")
def qwen3_swa(tmp_path_factory):
    """Tiny Qwen3 whose first layer slides over 12 tokens and whose second attends to everything."""
    path = tmp_path_factory.mktemp("qwen3_swa")
    make_model(path, "qwen3", **hybrid(12))
    return str(path)
