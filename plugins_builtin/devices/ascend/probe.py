"""What torch-npu reports about this machine: SoC, CANN version, device count.

``python -m deepinfer_builtin.devices.ascend.probe`` prints the facts as one JSON line. The device plugin
runs it in a child process unless torch_npu is already imported, so that listing plugins or
``device: auto`` never imports torch_npu into the engine's process, and a CANN install that
aborts on import cannot take the caller down with it. Imports nothing from deepinfer.
"""
from __future__ import annotations

import json
import sys
from typing import Any


def collect() -> dict[str, Any]:
    """Import torch_npu and read the facts; errors are reported in the result, never raised."""
    facts: dict[str, Any] = {}
    try:
        import torch
        import torch_npu

        facts["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
        facts["available"] = bool(torch.npu.is_available())
        facts["count"] = int(torch.npu.device_count()) if facts["available"] else 0
        if facts["count"]:
            facts["soc"] = str(torch_npu.npu.get_device_name(0))
        facts["cann"] = _cann_version(torch, torch_npu)
    except BaseException as e:  # noqa: BLE001 - the probe reports, the caller decides
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts


def _cann_version(torch: Any, torch_npu: Any) -> str | None:
    getter = getattr(getattr(torch_npu.npu, "utils", None), "get_cann_version", None)
    if getter is not None:
        try:
            return str(getter(module="CANN"))
        except Exception:  # noqa: BLE001, S110 - older CANN packages lack the version file it reads
            pass
    cann = getattr(torch.version, "cann", None)  # set by torch_npu on import
    return str(cann) if cann else None


if __name__ == "__main__":
    sys.stdout.write(json.dumps(collect()) + "\n")
