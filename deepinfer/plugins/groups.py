"""The entry-point groups, one per slot, and what each slot's plugins must subclass."""
from __future__ import annotations

from dataclasses import dataclass

from deepinfer.core.interfaces import AttentionBackend, CachePolicy, Device, Drafter, Scheduler


@dataclass(frozen=True, slots=True)
class Slot:
    name: str
    group: str
    base: type | None
    exclusive: bool


SLOTS: tuple[Slot, ...] = (
    Slot("device", "deepinfer.devices", Device, True),
    Slot("attention", "deepinfer.attention", AttentionBackend, True),
    Slot("cache_policy", "deepinfer.cache_policies", CachePolicy, False),
    Slot("drafter", "deepinfer.drafters", Drafter, True),
    Slot("scheduler", "deepinfer.schedulers", Scheduler, True),
    Slot("hooks", "deepinfer.hooks", None, False),
)
MODELS_GROUP = "deepinfer.models"
SLOT_BY_NAME = {s.name: s for s in SLOTS}
