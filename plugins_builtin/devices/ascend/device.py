"""The `ascend` device: Huawei Ascend NPUs (910B, 910C, 950) through torch-npu, imported lazily.

torch_npu is imported only when this device is constructed (it was selected). Asking whether the
device is usable (``deepinfer plugins list``, ``device: auto``) probes torch-npu in a child
process unless the engine's process has already imported it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Device, EngineContext
from deepinfer_builtin.devices.ascend.ops import INSTALL_HINT, import_torch_npu, torch_npu_installed

# (device-name prefix, family, oldest CANN): TND paged attention in npu_fused_infer_attention_score
# needs CANN 8.3 (vllm-ascend gates it on that); CANN 9.0.0 is the first release for Ascend 950PR.
FAMILIES: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("ascend950", "Ascend 950", (9, 0)),
    ("ascend910_93", "Ascend 910C (Atlas A3)", (8, 3)),
    ("ascend910b", "Ascend 910B (Atlas A2)", (8, 3)),
)
PROBE_TIMEOUT_S = 180


class AscendOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_index: int = Field(0, ge=0)
    activation_reserve_gb: float = Field(2.0, ge=0, description="NPU memory kept free for activations")
    deterministic: bool = Field(False, description="deterministic kernels and CANN strong consistency")


def soc_family(name: str) -> tuple[str, tuple[int, int]] | None:
    low = name.lower()
    for prefix, family, cann in FAMILIES:
        if low.startswith(prefix):
            return family, cann
    return None


def parse_cann(version: str | None) -> tuple[int, int] | None:
    """'8.3.RC1' -> (8, 3); '9.0.0' -> (9, 0); None when it is not a CANN version string."""
    m = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def reason_from_facts(facts: dict[str, Any]) -> str | None:
    """Why this machine cannot run the ascend device, from probe.collect()'s facts (None: it can)."""
    if "error" in facts:
        return (f"importing torch_npu failed: {facts['error']} (is the CANN toolkit installed and its "
                "set_env.sh sourced?)")
    if not facts.get("available") or not facts.get("count"):
        return ("no Ascend NPU is visible (torch.npu.is_available() is False); check the driver and "
                "ASCEND_RT_VISIBLE_DEVICES")
    soc = facts.get("soc", "")
    fam = soc_family(soc)
    if fam is None:
        known = ", ".join(f for _, f, _ in FAMILIES)
        return f"NPU 0 is {soc!r}, which this plugin does not support; supported: {known}"
    family, oldest = fam
    cann = parse_cann(facts.get("cann"))
    if cann is None:
        return (f"cannot tell the CANN version (got {facts.get('cann')!r}); {family} needs CANN "
                f"{oldest[0]}.{oldest[1]} or newer")
    if cann < oldest:
        return f"{family} needs CANN {oldest[0]}.{oldest[1]} or newer; this machine has {facts['cann']}"
    return None


@lru_cache(maxsize=1)
def probe_facts() -> dict[str, Any]:
    """The probe's facts: in-process when torch_npu is already imported, else in a child process."""
    if "torch_npu" in sys.modules:
        from deepinfer_builtin.devices.ascend.probe import collect

        return collect()
    try:
        res = subprocess.run([sys.executable, "-m", "deepinfer_builtin.devices.ascend.probe"], capture_output=True,
                             text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"the torch_npu probe did not finish: {e}"}
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        return {"error": tail}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable probe output: {lines[-1][:200]}"}


class AscendDevice(Device):
    """One Ascend NPU: SoC and CANN checks, KV memory budget, streams, events and NPU graphs."""

    name = "ascend"
    specificity = 80
    default_attention = "ascend-attention"
    dist_backend = "hccl"
    visible_devices_env: ClassVar[str] = "ASCEND_RT_VISIBLE_DEVICES"
    #: the paged attention kernel takes block sizes of 128, 256, 384 or 512 tokens
    preferred_block_size: ClassVar[int] = 128
    Options = AscendOptions

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            if not torch_npu_installed():
                return INSTALL_HINT
            return reason_from_facts(probe_facts())
        except Exception as e:  # noqa: BLE001 - never raise from an availability check
            return f"availability check failed: {type(e).__name__}: {e}"

    def __init__(self, options: AscendOptions, ctx: EngineContext) -> None:
        super().__init__(options, ctx)
        self.npu = import_torch_npu()
        self.npu.npu.set_device(options.device_index)
        if "block_size" not in ctx.config.model_fields_set:
            # the engine reads block_size after building the device; the core's default (16) is
            # one the paged kernel refuses. An explicit block_size is kept (and checked by the
            # attention backend).
            ctx.config.block_size = self.preferred_block_size
        if options.deterministic:
            self._make_deterministic()

    def batch_invariance_unavailable(self) -> str | None:
        return ("torch-npu's matmuls are documented to give a row the same result wherever it sits only under "
                "CANN's strong consistency (the 'deterministic' option, CANN 8.5+), its attention kernel not at "
                "all, and nothing has been measured on an NPU; run with the 'deterministic' option for "
                "run-to-run reproducibility")

    def _make_deterministic(self) -> None:
        # torch's switch maps to CANN's ACL_OPT_DETERMINISTIC; level 2 adds strong consistency (the
        # same row gives the same matmul result wherever it sits; CANN 8.5+); HCCL reduces in order
        torch.use_deterministic_algorithms(True)
        set_level = getattr(self.npu.npu, "set_deterministic_level", None)
        if set_level is not None and (parse_cann(probe_facts().get("cann")) or (0, 0)) >= (8, 5):
            set_level(2)
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")

    @property
    def torch_device(self) -> torch.device:
        return torch.device("npu", self.options.device_index)

    def kv_cache_budget(self, model_bytes: int) -> int:
        cfg = self.ctx.config
        if cfg.kv_cache_memory_gb is not None:
            return int(cfg.kv_cache_memory_gb * (1 << 30))
        free, total = torch.npu.mem_get_info(self.torch_device)
        used = total - free  # the weights are loaded by now, plus whatever else holds NPU memory
        reserve = int(self.options.activation_reserve_gb * (1 << 30))
        return max(0, int(total * cfg.gpu_memory_utilization) - used - reserve)

    def synchronize(self) -> None:
        torch.npu.synchronize(self.torch_device)

    def stream(self) -> Any:
        return torch.npu.Stream(device=self.torch_device)

    def event(self, enable_timing: bool = False) -> Any:
        return torch.npu.Event(enable_timing=enable_timing)

    def new_graph(self) -> Any | None:
        """An NPU graph to capture into, or None where this torch-npu has no graph API (run eager)."""
        graph_cls = getattr(self.npu.npu, "NPUGraph", None)
        return graph_cls() if graph_cls is not None else None

    def capture(self, graph: Any, stream: Any | None = None) -> AbstractContextManager[Any]:
        """Context that records the NPU work issued inside it into ``graph`` (from new_graph)."""
        return self.npu.npu.graph(graph, stream=stream)
