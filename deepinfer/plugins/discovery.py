"""Finding plugins: entry points read with stevedore, loaded only when asked for."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib.metadata import EntryPoint, distributions

from stevedore import NamedExtensionManager

from deepinfer.plugins.groups import MODELS_GROUP, SLOTS, Slot

ALLOW_ENV = "DEEPINFER_PLUGINS"


class PluginError(ValueError):
    """A plugin cannot be found, selected or loaded; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One discovered entry point: name, slot, and the distribution that ships it."""

    name: str
    slot: Slot
    entry_point: EntryPoint

    @property
    def distribution(self) -> str:
        return distribution_of(self.slot.group, self.entry_point)

    @property
    def target(self) -> str:
        return self.entry_point.value


@cache
def _distribution_index() -> dict[tuple[str, str, str], str]:
    index = {}
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group.startswith("deepinfer."):
                index[(ep.group, ep.name, ep.value)] = f"{dist.metadata['Name']} {dist.version}"
    return index


def distribution_of(group: str, ep: EntryPoint) -> str:
    """The distribution (name and version) that ships an entry point of ``group``."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return f"{dist.metadata['Name']} {dist.version}"
    return _distribution_of(group, ep.name, ep.value)


def _distribution_of(group: str, name: str, value: str) -> str:
    return _distribution_index().get((group, name, value), "(unknown distribution)")


@lru_cache(maxsize=8)
def _entry_points(path: tuple[str, ...]) -> dict[str, list[EntryPoint]]:
    """Every deepinfer entry point importable from ``path`` (read once per sys.path)."""
    groups: dict[str, list[EntryPoint]] = {}
    seen: set[tuple[str, str, str]] = set()
    for dist in distributions():  # in sys.path order; a distribution found twice counts once
        for ep in dist.entry_points:
            key = (ep.group, ep.name, dist.metadata["Name"])
            if ep.group.startswith("deepinfer.") and key not in seen:
                seen.add(key)
                groups.setdefault(ep.group, []).append(ep)
    return groups


def group_entry_points(group: str) -> list[EntryPoint]:
    import sys

    return list(_entry_points(tuple(sys.path)).get(group, []))


class _Manager(NamedExtensionManager):
    """stevedore's manager, reading entry points afresh rather than from stevedore's on-disk cache,
    which can miss a plugin package installed a moment ago (mtimes with coarse resolution)."""

    def list_entry_points(self) -> list[EntryPoint]:
        return group_entry_points(self.namespace)


def allow_list() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def discover(respect_allow_list: bool = True) -> list[PluginInfo]:
    """Every plugin entry point of every slot, without importing any of them."""
    allowed = allow_list() if respect_allow_list else None
    found = []
    for slot in SLOTS:
        for ep in group_entry_points(slot.group):
            if allowed is None or ep.name in allowed:
                found.append(PluginInfo(ep.name, slot, ep))
    return found


def load(info: PluginInfo) -> type:
    """Import a plugin's class; failures name the plugin and its distribution."""
    errors: list[BaseException] = []

    def failed(_mgr, _ep, exc: BaseException) -> None:
        errors.append(exc)

    mgr = _Manager(info.slot.group, names=[info.name], on_load_failure_callback=failed,
                                on_missing_entrypoints_callback=lambda names: None)
    if errors or info.name not in mgr.names():
        exc = errors[0] if errors else None
        detail = f"{type(exc).__name__}: {exc}" if exc else "entry point vanished"
        raise PluginError(f"plugin {info.name!r} ({info.slot.name}, from {info.distribution}, "
                          f"{info.target}) failed to load: {detail}") from exc
    cls = mgr[info.name].plugin
    if info.slot.base is not None and not (isinstance(cls, type) and issubclass(cls, info.slot.base)):
        raise PluginError(f"plugin {info.name!r} from {info.distribution} points at {info.target}, "
                          f"which is not a {info.slot.base.__name__} subclass")
    return cls


def model_entry_points(respect_allow_list: bool = True) -> list[EntryPoint]:
    """The model architectures' entry points. Under ``DEEPINFER_PLUGINS``, another distribution's
    only when its name is on the list (deepinfer's own architectures are part of it and stay)."""
    allowed = allow_list() if respect_allow_list else None
    return [ep for ep in group_entry_points(MODELS_GROUP) if allowed is None or allowed_entry_point(ep, allowed)]


def allowed_entry_point(ep: EntryPoint, allowed: set[str] | None) -> bool:
    """Whether an entry point passes the allow-list (None: no list); a model architecture of
    deepinfer's own distribution always does."""
    if allowed is None or ep.name in allowed:
        return True
    return ep.group == MODELS_GROUP and distribution_of(MODELS_GROUP, ep).split()[0] == "deepinfer"
