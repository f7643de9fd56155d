"""Tool calling: a chat request's ``tools`` and ``tool_choice`` checked, the grammar that makes
``required`` and a named function hold (built from the tool parser's ``pieces`` with xgrammar),
and the calls parsed from each choice's text, whole or streamed."""
from __future__ import annotations

import json
import uuid
from typing import Any

from deepinfer.serve.protocol import APIError, ChatCompletionRequest


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _functions(req: ChatCompletionRequest) -> dict[str, dict[str, Any]]:
    """The request's functions by name (their parameters' schema), checked."""
    out = {}
    for i, tool in enumerate(req.tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise APIError(400, f"tools[{i}] is not a function tool ({{\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"parameters\": {...}}})", param="tools")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise APIError(400, f"tools[{i}].function.parameters is not a JSON schema object", param="tools")
        out[fn["name"]] = params
    return out


def tool_choice(req: ChatCompletionRequest) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "named", the named function)."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if req.tools else "none"), None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return "named", choice["function"]["name"]
    raise APIError(400, "tool_choice is 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}", param="tool_choice")


def tool_grammar(parser: Any, req: ChatCompletionRequest) -> str | None:
    """The EBNF grammar that makes the reply a call (``required``: of one of the tools; a named
    function: of that one), or None where the choice enforces nothing."""
    import xgrammar as xgr

    mode, named = tool_choice(req)
    if mode in ("none", "auto"):
        return None
    functions = _functions(req)
    if not functions:
        raise APIError(400, f"tool_choice {mode if mode != 'named' else named!r} needs tools", param="tool_choice")
    if named is not None and named not in functions:
        raise APIError(400, f"tool_choice names the function {named!r}, which is not among the tools "
                       f"({', '.join(functions)})", param="tool_choice")
    chosen = [named] if named is not None else list(functions)
    calls = []
    for name in chosen:
        parts = []
        for piece in parser.pieces(name, functions[name]):
            try:
                parts.append(xgr.Grammar.from_ebnf("root ::= " + json.dumps(piece, ensure_ascii=False))
                             if isinstance(piece, str) else
                             xgr.Grammar.from_json_schema(json.dumps(piece), any_whitespace=False, strict_mode=True))
            except Exception as e:  # noqa: BLE001 - xgrammar raises several kinds for a bad schema
                raise APIError(400, f"the parameters of tool {name!r} are not a JSON schema that can be compiled: "
                               f"{str(e).splitlines()[0]}", param="tools", code="invalid_grammar") from None
        calls.append(xgr.Grammar.concat(*parts))
    return str(calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls))


def calls_json(calls: list[tuple[str, str]], start: int | None = None) -> list[dict[str, Any]]:
    """OpenAI's ``tool_calls`` entries of these calls; with ``start``, numbered from it (``index``,
    as stream deltas carry it)."""
    return [{**({"index": start + k} if start is not None else {}), "id": tool_call_id(), "type": "function",
             "function": {"name": name, "arguments": args}} for k, (name, args) in enumerate(calls)]


class ToolStream:
    """One streamed choice's text split by a tool parser: each delta's new content and new calls."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.text = ""
        self.content = ""
        self.num_calls = 0

    def feed(self, delta: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.text += delta
        content, calls = self.parser.split(self.text, final)
        grown = content[len(self.content):] if content.startswith(self.content) else ""
        if content.startswith(self.content):
            self.content = content
        new = calls_json(calls[self.num_calls:], self.num_calls)
        self.num_calls = max(self.num_calls, len(calls))
        return grown, new
