"""The `cpu` device: always present; the KV pool takes a share of free memory."""
from __future__ import annotations

import os

import torch

from deepinfer.plugins import Device


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


class CPUDevice(Device):
    """Runs on the host CPU with torch's CPU kernels; the default where no accelerator is usable."""

    name = "cpu"
    specificity = 0
    default_attention = "torch"
    dist_backend = "gloo"
    asynchronous = False  # a step has finished when its Python call returns

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def kv_cache_budget(self, model_bytes: int) -> int:
        cfg = self.ctx.config
        if cfg.kv_cache_memory_gb is not None:
            return int(cfg.kv_cache_memory_gb * (1 << 30))
        # an eighth of what is free, at most 1 GiB: the CPU is shared with everything else, and
        # small models need little (the demo model keeps ~260K tokens of bf16 KV in 1 GiB)
        return min(1 << 30, _available_memory() // 8)

    @property
    def num_threads(self) -> int:
        return torch.get_num_threads() or os.cpu_count() or 1
