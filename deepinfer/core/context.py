"""What plugins may read about the engine they are built into."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepinfer.core.config import EngineConfig
    from deepinfer.core.interfaces import AttentionLayerSpec, Device
    from deepinfer.core.kv_blocks import KVBlocks
    from deepinfer.core.kv_manager import KVCacheManager
    from deepinfer.core.metrics import Metrics


@dataclass(slots=True)
class EngineContext:
    """Filled in as the engine is assembled: device first, then model facts, then the KV pool."""

    config: EngineConfig
    metrics: Metrics
    device: Device | None = None
    layers: list[AttentionLayerSpec] = field(default_factory=list)
    model_config: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    kv: KVCacheManager | None = None  # set after the cache policies are built (they may size it)
    #: copies whole blocks of the full-attention pool out of the device cache and back (with
    #: ``kv``; None where the attention backend's layout has no block dimension): for a policy
    #: that keeps blocks beyond device memory
    kv_blocks: KVBlocks | None = None
    dtype: Any = None  # the target model's torch dtype
    #: (model directory, attention backend, dtype=None) -> a loaded model on the engine's device,
    #: in the engine's dtype unless a torch dtype is given; lets a plugin run a second model (a
    #: drafter's) without reaching into the core
    load_model: Callable[..., Any] | None = None
    #: a fresh instance of the engine's attention backend, for a second model's own KV cache
    new_attention: Callable[[], Any] | None = None
