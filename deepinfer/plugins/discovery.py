"""Finding plugins with stevedore: its listing of each entry-point group (nothing imported), its
DriverManager to import the one plugin of a name (a slot that takes one, or a listing's check), and a
NamedExtensionManager for the plugins of a slot that takes several."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import EntryPoint, distributions

from stevedore import DriverManager, ExtensionManager, NamedExtensionManager
from stevedore.exception import MultipleMatches, NoMatches

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


@lru_cache(maxsize=8)
def _distribution_index(path: tuple[str, ...]) -> dict[tuple[str, str, str], str]:
    """(group, name, value) -> "distribution version" of every deepinfer entry point on ``path``
    (stevedore's listing keeps no distribution: this names it)."""
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
    return _distribution_index(tuple(sys.path)).get((group, name, value), "(unknown distribution)")


def fresh(group: str) -> str:
    """``group``, its listing dropped from stevedore's cache first: stevedore keeps a group's listing
    for the process (``ExtensionManager.ENTRY_POINT_CACHE``), and a plugin package put on sys.path
    later (installed meanwhile, or a test's site) must be seen. Its own cache by sys.path and the
    entry-point files' times stays."""
    ExtensionManager.ENTRY_POINT_CACHE.pop(group, None)
    return group


def group_entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group``, none imported: stevedore's listing (a manager asked for no
    names loads nothing)."""
    return NamedExtensionManager(fresh(group), names=[]).list_entry_points()


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
    """Import one plugin's class through stevedore's DriverManager (exactly one plugin of that name
    in its group); failures name the plugin and its distribution."""
    errors: list[BaseException] = []

    def failed(_mgr, _ep, exc: BaseException) -> None:
        errors.append(exc)

    try:
        cls = DriverManager(fresh(info.slot.group), info.name, on_load_failure_callback=failed).driver
    except MultipleMatches:
        where = ", ".join(distribution_of(info.slot.group, ep) for ep in group_entry_points(info.slot.group)
                          if ep.name == info.name)
        raise PluginError(f"plugin name {info.name!r} is registered more than once for the {info.slot.name} "
                          f"slot (by {where}); uninstall one of them") from None
    except NoMatches:
        exc = errors[0] if errors else None
        detail = f"{type(exc).__name__}: {exc}" if exc else "entry point vanished"
        raise PluginError(f"plugin {info.name!r} ({info.slot.name}, from {info.distribution}, "
                          f"{info.target}) failed to load: {detail}") from exc
    if info.slot.base is not None and not (isinstance(cls, type) and issubclass(cls, info.slot.base)):
        raise PluginError(f"plugin {info.name!r} from {info.distribution} points at {info.target}, "
                          f"which is not a {info.slot.base.__name__} subclass")
    return cls


def load_several(infos: list[PluginInfo]) -> list[type]:
    """Import the plugins of one slot that takes several (cache policies, hooks), in the order given,
    through one stevedore NamedExtensionManager; failures name the plugin as ``load`` does."""
    if not infos:
        return []
    slot = infos[0].slot
    errors: dict[str, BaseException] = {}

    def failed(_mgr, ep, exc: BaseException) -> None:
        errors.setdefault(ep.name, exc)

    mgr = NamedExtensionManager(fresh(slot.group), names=[i.name for i in infos], name_order=True,
                                on_load_failure_callback=failed, on_missing_entrypoints_callback=lambda names: None)
    by_name = {ext.name: ext.plugin for ext in mgr}
    out = []
    for info in infos:
        if info.name not in by_name or info.name in errors:  # (its failure, or a name found twice: load says which)
            load(info)
        cls = by_name[info.name]
        if slot.base is not None and not (isinstance(cls, type) and issubclass(cls, slot.base)):
            raise PluginError(f"plugin {info.name!r} from {info.distribution} points at {info.target}, "
                              f"which is not a {slot.base.__name__} subclass")
        out.append(cls)
    return out


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
