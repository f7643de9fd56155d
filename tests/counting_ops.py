"""A device's fused ops that count their calls, for the interpreter children of the fused-kernel
tests (they import it from the repository root)."""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any


def by_name(name: str, args: tuple, kwargs: dict) -> str:
    """The default key: the op's name, with "+kv_cache" where the call writes the KV cache."""
    return name + ("+kv_cache" if kwargs.get("kv_cache") is not None else "")


class CountingOps:
    """``ops`` (a FusedOps, or the kernels module) whose callable members count their calls in
    ``calls`` under ``key(name, args, kwargs)``; ``only``: count just these members."""

    def __init__(self, ops: Any, only: Collection[str] | None = None,
                 key: Callable[[str, tuple, dict], str] = by_name) -> None:
        self.ops, self.only, self.key = ops, only, key
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.ops, name)
        if not callable(fn) or (self.only is not None and name not in self.only):
            return fn

        def counted(*args: Any, **kwargs: Any) -> Any:
            k = self.key(name, args, kwargs)
            self.calls[k] = self.calls.get(k, 0) + 1
            return fn(*args, **kwargs)

        return counted
