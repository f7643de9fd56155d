"""What plugins may read about the engine they are built into."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepinfer.core.config import EngineConfig
    from deepinfer.core.interfaces import AttentionLayerSpec, Device
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
    kv: KVCacheManager | None = None
