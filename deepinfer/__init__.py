"""deepinfer: an LLM inference and serving engine with a minimal core and plugins for the rest."""
from __future__ import annotations

import os

# torch-npu registers itself for torch's device-backend autoload, after which `import torch` fails
# on a machine without the Ascend CANN libraries. deepinfer imports torch_npu itself, and only when
# the ascend plugins are selected, so it turns autoload off unless the user chose otherwise.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from pathlib import Path
from typing import TYPE_CHECKING

from deepinfer.core.sampling_params import SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"

_ASSETS = Path(__file__).parent / "assets"
DEMO_MODEL = str(_ASSETS / "demo-target")
DEMO_DRAFT_MODEL = str(_ASSETS / "demo-draft")

if TYPE_CHECKING:
    from deepinfer.llm import LLM


def __getattr__(name: str):
    if name == "LLM":
        from deepinfer.llm import LLM

        return LLM
    raise AttributeError(f"module 'deepinfer' has no attribute {name!r}")


__all__ = ["DEMO_DRAFT_MODEL", "DEMO_MODEL", "LLM", "SamplingParams", "StructuredOutputsParams", "__version__"]
