"""A chat choice's text as the reply's parts: reasoning (``--reasoning-parser``), content and tool
calls (``--tool-call-parser``, when the request has tools), whole or as each delta's growth."""
from __future__ import annotations

from typing import Any

from deepinfer.serve.parsers import ReasoningStream
from deepinfer.serve.protocol import AssistantMessage, DeltaMessage
from deepinfer.serve.tools import ToolStream, calls_json


def whole_message(reasoning_parser: Any, tool_parser: Any, text: str) -> AssistantMessage:
    """A whole choice's message (``tool_parser`` None: the request's tools are not parsed)."""
    thought = ""
    if reasoning_parser is not None:
        thought, text = reasoning_parser.split(text, True)
    calls: list = []
    if tool_parser is not None:
        text, calls = tool_parser.split(text, True)
        text = text.strip()
    return AssistantMessage(content=text or None, reasoning_content=thought or None,
                            tool_calls=calls_json(calls) or None)


class ReplyStream:
    """One streamed choice: each delta's growth of its reasoning, content and calls."""

    def __init__(self, reasoning_parser: Any, tool_parser: Any) -> None:
        self.reasoning = ReasoningStream(reasoning_parser) if reasoning_parser is not None else None
        self.tools = ToolStream(tool_parser) if tool_parser is not None else None

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.num_calls > 0

    def feed(self, text: str, final: bool) -> DeltaMessage | None:
        """The delta's message (None: nothing to show yet)."""
        thought = ""
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text, final)
        calls: list = []
        if self.tools is not None:
            text, calls = self.tools.feed(text, final)
        if not (text or thought or calls):
            return None
        return DeltaMessage(content=text if text or not (thought or calls) else None,
                            reasoning_content=thought or None, tool_calls=calls or None)
