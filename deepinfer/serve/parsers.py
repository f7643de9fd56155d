"""The server's output parsers, found by name in their entry-point groups (stevedore), and the state
of one streamed choice split by a reasoning parser.

A reasoning parser (group ``deepinfer.reasoning_parsers``) is a class with a ``name`` and
``split(text, final) -> (reasoning, content)``; the built-in one is
``deepinfer_builtin.parsers.reasoning``."""
from __future__ import annotations

from typing import Any

from stevedore import DriverManager

from deepinfer.plugins.discovery import allow_list, fresh, group_entry_points

REASONING_GROUP = "deepinfer.reasoning_parsers"
TOOL_GROUP = "deepinfer.tool_parsers"


def load_parser(group: str, name: str, flag: str) -> Any:
    """An instance of the parser ``name`` of ``group``; ValueError listing the installed ones when
    there is none of that name (``flag``: the option that named it)."""
    allowed = allow_list()  # (DEEPINFER_PLUGINS: nothing else is imported)
    names = sorted({ep.name for ep in group_entry_points(group) if allowed is None or ep.name in allowed})
    if name not in names:
        raise ValueError(f"{flag} {name!r} is not installed; installed: {', '.join(names) or 'none'}")
    return DriverManager(fresh(group), name).driver()


class ReasoningStream:
    """One streamed choice's text split by a reasoning parser: each delta's growth of the reasoning
    and of the content."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.text = ""
        self.sent = ("", "")

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) that ``delta`` adds; with ``final``, whatever was held back too."""
        self.text += delta
        parts = self.parser.split(self.text, final)
        grown = tuple(new[len(old):] if new.startswith(old) else "" for new, old in zip(parts, self.sent, strict=True))
        self.sent = tuple(new if new.startswith(old) else old for new, old in zip(parts, self.sent, strict=True))
        return grown
