"""Which plugin's code an exception was raised in, from its traceback (for error messages)."""
from __future__ import annotations

import sys
from types import TracebackType
from typing import NamedTuple

from deepinfer.plugins.discovery import MODELS_GROUP, discover, distribution_of, model_entry_points


def _loaded_plugins() -> dict[str, list[tuple[str, str, object | None]]]:
    """module name -> [(plugin name, distribution, its class or None)] for imported plugins only."""
    out: dict[str, list[tuple[str, str, object | None]]] = {}
    entries = [(i.entry_point, i.name, i.slot.group) for i in discover(respect_allow_list=False)]
    entries += [(ep, ep.name, MODELS_GROUP) for ep in model_entry_points()]
    for ep, name, group in entries:
        module = sys.modules.get(ep.module)
        if module is None:  # (never imported: its code cannot have run)
            continue
        obj = getattr(module, ep.attr, None) if ep.attr else None
        out.setdefault(ep.module, []).append((name, distribution_of(group, ep), obj))
    return out


def _frames(exc: BaseException) -> list[tuple[str, object | None]]:
    """(module name, the ``self``'s class or None) of every frame of ``exc``'s own traceback,
    innermost first (not its causes: a PluginError raised from a plugin's failed import is
    deepinfer's report, already naming the plugin)."""
    frames: list[tuple[str, object | None]] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        f = tb.tb_frame
        owner = f.f_locals.get("self", f.f_locals.get("cls"))
        if owner is not None and not isinstance(owner, type):
            owner = type(owner)
        frames.append((f.f_globals.get("__name__", ""), owner))
        tb = tb.tb_next
    return frames[::-1]


class PluginOrigin(NamedTuple):
    """The plugin an exception came from: ``label`` names it and its distribution; ``builtin``: one
    of deepinfer's own, whose ValueErrors are its checks of the user's input."""

    label: str
    builtin: bool

    def __str__(self) -> str:
        return self.label


OWN_PACKAGES = ("deepinfer", "deepinfer_builtin")


def plugin_origin(exc: BaseException) -> PluginOrigin | None:
    """Where ``exc`` was raised inside a plugin's code (the innermost frame of a plugin's module),
    or None when it came from deepinfer's own code."""
    plugins = _loaded_plugins()
    frames = _frames(exc)
    for module, owner in frames:
        candidates = plugins.get(module)
        if not candidates:
            continue
        exact = [c for c in candidates if isinstance(c[2], type) and owner is not None and issubclass(owner, c[2])]
        picked = exact[:1] or candidates
        names = " or ".join(sorted({repr(c[0]) for c in picked}))
        return PluginOrigin(f"plugin {names} ({picked[0][1]})", module.split(".")[0] in OWN_PACKAGES)
    packages = {m.split(".")[0]: items[0][1] for m, items in plugins.items() if m.split(".")[0] not in OWN_PACKAGES}
    for module, _ in frames:  # (a helper module of a plugin package that no plugin module called)
        top = module.split(".")[0]
        if top in packages:
            return PluginOrigin(f"plugin package {top} ({packages[top]}, in {module})", False)
    return None
