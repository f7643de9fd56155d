"""The ascend attention backend with the CPU stand-ins in place of torch_npu: the plugin's own code
(KV writes, metadata, the arguments of every torch-npu call) runs unchanged on the CPU.

Registered, in the tests only, as attention plugin `ascend-standin` (the name `ascend` selects the
device, which cannot run without an NPU).
"""
from __future__ import annotations

from deepinfer_builtin.attention.ascend import AscendAttention
from deepinfer_builtin.devices.ascend.ops import KernelLimits
from tests.plugins.ascend.standins import standin_npu


class StandinAscendAttention(AscendAttention):
    """AscendAttention over standins.standin_npu(); tests may change ``missing`` and ``limits``."""

    name = "ascend-standin"
    missing: tuple[str, ...] = ()
    limits_for_test: KernelLimits | None = None
    last = None  # the most recent instance, so tests can read its call log

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @classmethod
    def kernels(cls):
        return standin_npu(cls.missing), cls.limits_for_test

    def __init__(self, options, ctx) -> None:
        super().__init__(options, ctx)
        StandinAscendAttention.last = self
