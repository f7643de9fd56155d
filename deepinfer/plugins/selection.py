"""From EngineConfig to plugin classes and their validated options, one per exclusive slot."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from deepinfer.core.config import EngineConfig
from deepinfer.core.interfaces import NoOptions
from deepinfer.plugins.discovery import ALLOW_ENV, PluginError, PluginInfo, allow_list, discover, load, load_several
from deepinfer.plugins.groups import SLOT_BY_NAME
from deepinfer.plugins.hookcheck import hook_problems

DEFAULTS = {"scheduler": "fcfs", "cache_policy": "no-cache"}


@dataclass(slots=True)
class Selection:
    """The chosen plugin of each slot (cache policies and hooks: an ordered list)."""

    chosen: dict[str, list[PluginInfo]] = field(default_factory=dict)
    classes: dict[str, type] = field(default_factory=dict)
    options: dict[str, BaseModel] = field(default_factory=dict)

    def one(self, slot: str) -> PluginInfo | None:
        items = self.chosen.get(slot) or []
        return items[0] if items else None

    def all(self, slot: str) -> list[PluginInfo]:
        return list(self.chosen.get(slot) or [])


def _unknown(name: str, infos: list[PluginInfo], slot: str | None = None) -> PluginError:
    pool = [i for i in infos if slot is None or i.slot.name == slot]
    known = ", ".join(sorted({i.name for i in pool})) or "(none)"
    allowed = allow_list()
    hint = f" ({ALLOW_ENV} allows only: {', '.join(sorted(allowed))})" if allowed is not None else ""
    what = f"{slot} plugin" if slot else "plugin"
    return PluginError(f"unknown {what} {name!r}; known: {known}{hint}")


def _resolve_name(name: str, infos: list[PluginInfo]) -> PluginInfo:
    cands = [i for i in infos if i.name == name and i.slot.name != "hooks"] or \
            [i for i in infos if i.name == name]
    if not cands:
        raise _unknown(name, infos)
    if len(cands) > 1:
        where = ", ".join(f"{c.slot.name} ({c.distribution})" for c in cands)
        raise PluginError(f"plugin name {name!r} is ambiguous: it is registered for {where}")
    return cands[0]


def _pick_device(requested: str, infos: list[PluginInfo]) -> PluginInfo:
    devices = [i for i in infos if i.slot.name == "device"]
    if requested != "auto":
        for i in devices:
            if i.name == requested:
                return i
        raise _unknown(requested, infos, "device")
    best: tuple[int, PluginInfo] | None = None
    for info in devices:
        try:
            cls = load(info)
            usable = cls.unavailable_reason() is None
        except Exception:  # noqa: BLE001, S112 (a failing probe rules its device out; `plugins list` says why)
            continue
        if usable and (best is None or cls.specificity > best[0]):
            best = (cls.specificity, info)
    if best is None:
        raise PluginError("device: auto found no usable device plugin; run `deepinfer plugins list` "
                          "to see why each one cannot load")
    return best[1]


def select(config: EngineConfig) -> Selection:
    """Resolve ``config.plugins`` and ``config.device`` into classes and options, or raise PluginError."""
    infos = discover()
    sel = Selection()
    for name in config.plugins:
        info = _resolve_name(name, infos)
        slot = info.slot
        taken = sel.chosen.setdefault(slot.name, [])
        if slot.exclusive and taken:
            raise PluginError(f"two plugins for the {slot.name} slot, which takes one: "
                              f"{taken[0].name!r} and {name!r}; keep one of them")
        taken.append(info)
    device = sel.one("device")
    if device is None:
        sel.chosen["device"] = [_pick_device(config.device, infos)]
    elif config.device not in ("auto", device.name):
        raise PluginError(f"device {config.device!r} conflicts with device plugin {device.name!r} in plugins")
    sel.classes = {i.name: load(i) for i in sel.all("device")}
    if "attention" not in sel.chosen:
        want = sel.classes[sel.one("device").name].default_attention
        sel.chosen["attention"] = [_find(want, "attention", infos)]
    for slot, name in DEFAULTS.items():
        if slot not in sel.chosen:
            sel.chosen[slot] = [_find(name, slot, infos)]
    for slot_name, items in sel.chosen.items():
        todo = [i for i in items if i.name not in sel.classes]
        if SLOT_BY_NAME[slot_name].exclusive:
            sel.classes.update((i.name, load(i)) for i in todo)
        else:
            sel.classes.update(zip((i.name for i in todo), load_several(todo), strict=True))
    _check_dependencies(sel)
    _check_exclusions(sel)
    _check_hooks(sel)
    sel.options = _validate_options(config, sel)
    return sel


def _find(name: str, slot: str, infos: list[PluginInfo]) -> PluginInfo:
    for i in infos:
        if i.name == name and i.slot.name == slot:
            return i
    raise _unknown(name, infos, slot)


def _check_dependencies(sel: Selection) -> None:
    names = {i.name for items in sel.chosen.values() for i in items}
    for name, cls in sel.classes.items():
        for dep in getattr(cls, "requires", ()):
            if dep not in names:
                raise PluginError(f"plugin {name!r} needs plugin {dep!r}: add it to plugins "
                                  f"(for example --plugins {dep},{name})")


def _check_exclusions(sel: Selection) -> None:
    """A plugin's ``excludes`` names plugins it contradicts: selecting both is refused, as two
    plugins for a slot that takes one are (either side may declare it)."""
    names = [i.name for items in sel.chosen.values() for i in items]
    for name in names:
        for other in getattr(sel.classes[name], "excludes", ()):
            if other in names:
                raise PluginError(f"plugins {name!r} and {other!r} contradict each other ({name!r} excludes "
                                  f"{other!r}); keep one of them")


def _check_hooks(sel: Selection) -> None:
    """Every ``@hookimpl`` of a selected plugin (hook plugins, and slot plugins implementing hooks)
    against the specs: pluggy would accept a name no spec has, and fail late on a bad argument."""
    for info in (i for items in sel.chosen.values() for i in items):
        problems = hook_problems(sel.classes[info.name])
        if problems:
            kind = "hook plugin" if info.slot.name == "hooks" else "plugin"
            raise PluginError(f"{kind} {info.name!r} (from {info.distribution}) cannot run: " + "; ".join(problems))


def _validate_options(config: EngineConfig, sel: Selection) -> dict[str, BaseModel]:
    out: dict[str, BaseModel] = {}
    for name, cls in sel.classes.items():
        model = getattr(cls, "Options", None)
        raw: dict[str, Any] = config.plugin_options.get(name, {})
        if model is None:  # hook modules take no options
            if raw:
                raise PluginError(f"plugin {name!r} takes no options, got {sorted(raw)}")
            out[name] = NoOptions()
            continue
        unknown = sorted(set(raw) - set(model.model_fields))
        if unknown:  # (a typo: name the valid ones, in one line)
            raise PluginError(f"plugin {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                              f"{', '.join(sorted(model.model_fields))}")
        try:
            out[name] = model(**raw)
        except ValidationError as e:
            raise PluginError(f"options of plugin {name!r} are invalid:\n{e}") from None
    stray = sorted(set(config.plugin_options) - set(sel.classes))
    if stray:
        raise PluginError(f"options given for {stray}, which are not selected plugins; "
                          f"selected: {', '.join(sorted(sel.classes))}")
    return out


def instantiate_hooks(sel: Selection) -> list[Any]:
    """Objects to register with pluggy for the selected hook plugins: a module as it is, a class
    instantiated, with its validated options where it declares an ``Options`` model."""
    out = []
    for info in sel.all("hooks"):
        obj = sel.classes[info.name]
        if isinstance(obj, type):
            obj = obj(sel.options[info.name]) if getattr(obj, "Options", None) is not None else obj()
        out.append(obj)
    return out
