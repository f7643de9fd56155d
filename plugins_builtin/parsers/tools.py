"""Tool-call parsers: the calls a model wrote in its chat format, apart from its other text.

A tool parser is a class with a ``name``, ``split(text, final) -> (content, calls)`` (the text
outside complete call blocks, and each complete call as (function name, arguments as JSON text)),
and ``pieces(name, parameters)``: what one call of a function looks like, as literal strings and
JSON schemas in order, from which the server builds the grammar that enforces ``tool_choice``
required or a named function. As with reasoning parsers, ``final`` False holds back a start tag's
first characters and an unfinished block, so that splits of a growing text only grow."""
from __future__ import annotations

import json
import re
from typing import Any

from deepinfer_builtin.parsers.reasoning import partial_tag

Call = tuple[str, str]  # function name, arguments (JSON text)


class TaggedToolParser:
    """Calls in blocks between ``start`` and ``end`` tags; ``parse_block`` reads one block's calls."""

    name = ""
    start = ""
    end = ""

    def parse_block(self, inner: str) -> list[Call] | None:
        raise NotImplementedError

    def pieces(self, name: str, parameters: dict[str, Any]) -> list[str | dict[str, Any]]:
        raise NotImplementedError

    def split(self, text: str, final: bool = True) -> tuple[str, list[Call]]:
        """(content, calls) of ``text``: a block that does not parse stays in the content as written."""
        content: list[str] = []
        calls: list[Call] = []
        pos = 0
        while True:
            i = text.find(self.start, pos)
            if i < 0:
                tail = text[pos:]
                content.append(tail if final else tail[:len(tail) - partial_tag(tail, (self.start,))])
                break
            content.append(text[pos:i])
            j = text.find(self.end, i + len(self.start))
            if j < 0:  # unfinished: held back while the text grows, its text at the end
                if final:
                    content.append(text[i:])
                break
            parsed = self.parse_block(text[i + len(self.start):j])
            if parsed is None:
                content.append(text[i:j + len(self.end)])
            else:
                calls.extend(parsed)
            pos = j + len(self.end)
        return "".join(content), calls


def _arguments(value: Any) -> str | None:
    if isinstance(value, str):  # (arguments written as JSON text inside the JSON)
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


class HermesToolParser(TaggedToolParser):
    """Hermes' and Qwen's format: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    one block a call."""

    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"

    def parse_block(self, inner: str) -> list[Call] | None:
        try:
            obj = json.loads(inner)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = _arguments(obj.get("arguments", obj.get("parameters", {})))
        return None if args is None else [(obj["name"], args)]

    def pieces(self, name: str, parameters: dict[str, Any]) -> list[str | dict[str, Any]]:
        call = {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"], "additionalProperties": False}
        return [self.start + "\n", call, "\n" + self.end]


class DeepSeekV3ToolParser(TaggedToolParser):
    """DeepSeek-V3's format: ``<｜tool▁calls▁begin｜>`` then, a call each,
    ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``, then
    ``<｜tool▁calls▁end｜>``."""

    name = "deepseek_v3"
    start = "<｜tool▁calls▁begin｜>"
    end = "<｜tool▁calls▁end｜>"
    _CALL = re.compile(r"<｜tool▁call▁begin｜>(?P<type>.*?)<｜tool▁sep｜>(?P<name>.*?)\n```json\n(?P<args>.*?)\n```"
                       r"<｜tool▁call▁end｜>", re.DOTALL)

    def parse_block(self, inner: str) -> list[Call] | None:
        calls = []
        for m in self._CALL.finditer(inner):
            args = _arguments(m["args"])
            if args is None:
                return None
            calls.append((m["name"].strip(), args))
        return calls or None

    def pieces(self, name: str, parameters: dict[str, Any]) -> list[str | dict[str, Any]]:
        return [f"{self.start}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n", parameters,
                f"\n```<｜tool▁call▁end｜>{self.end}"]
