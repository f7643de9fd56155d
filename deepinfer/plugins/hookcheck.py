"""Checking a hook plugin's ``@hookimpl`` functions against the specs in ``hookspecs``.

pluggy accepts an implementation whose name matches no spec (it never runs) and fails late, with
its own exception, on an argument the spec does not have; these checks say both up front, with
the spec's signature, for ``plugins list`` and for selection.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any

from deepinfer.plugins import hookspecs

PROJECT = "deepinfer"


def _specs() -> dict[str, inspect.Signature]:
    out = {}
    for name, fn in vars(hookspecs).items():
        if callable(fn) and getattr(fn, f"{PROJECT}_spec", None) is not None:
            out[name] = inspect.signature(fn)
    return out


def spec_signature(name: str) -> str:
    """``name(arg, ...)`` as the spec declares it."""
    sig = _specs()[name]
    return f"{name}({', '.join(sig.parameters)})"


def implementations(obj: Any) -> dict[str, Any]:
    """The functions of a hook plugin (module, class or instance) marked with ``@hookimpl``."""
    out = {}
    for attr in dir(obj):
        try:
            fn = getattr(obj, attr)
        except Exception:  # noqa: BLE001, S112 (a property that raises is not a hook)
            continue
        if callable(fn) and getattr(fn, f"{PROJECT}_impl", None) is not None:
            out[attr] = fn
    return out


def hook_problems(obj: Any) -> list[str]:
    """Each ``@hookimpl`` that can never run as written, in one sentence; [] when all can."""
    specs = _specs()
    problems = []
    for name, fn in sorted(implementations(obj).items()):
        if name not in specs:
            close = difflib.get_close_matches(name, specs, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{name} is no deepinfer hook{hint}; hooks: {', '.join(sorted(specs))}")
            continue
        params = list(inspect.signature(fn).parameters.values())
        if isinstance(obj, type) and inspect.isfunction(inspect.getattr_static(obj, name)):
            params = params[1:]  # (a method of a class not yet instantiated: its self)
        args = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        unknown = [a for a in args if a not in specs[name].parameters]
        if unknown:
            problems.append(f"{name} takes {', '.join(map(repr, unknown))}, which the spec "
                            f"{spec_signature(name)} does not pass")
    return problems
