"""The hermes and deepseek_v3 tool-call parsers on fixed outputs, whole and streamed in every split
into deltas (the streamed content and calls, joined, are the whole text's: the oracle), and the
grammar built from their ``pieces``: xgrammar's matcher accepts a call written in the format and
refuses one of another function or with arguments outside the schema."""
from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from deepinfer.serve.parsers import TOOL_GROUP, load_parser
from deepinfer.serve.protocol import ChatCompletionRequest
from deepinfer.serve.tools import ToolStream, tool_grammar
from deepinfer_builtin.parsers.tools import DeepSeekV3ToolParser, HermesToolParser

HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "",
     [("get_weather", '{"city": "Paris"}')]),
    (('Sure.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": '
     '{"x": [1, 2]}}\n</tool_call>'), "Sure.\n\n", [("a", "{}"), ("b", '{"x": [1, 2]}')]),
    ("no call here", "no call here", []),
    ('<tool_call>\n{"name": broken}\n</tool_call>', '<tool_call>\n{"name": broken}\n</tool_call>', []),
    ('<tool_call>\n{"name": "cut"', '<tool_call>\n{"name": "cut"', []),  # unfinished: its text at the end
]
V3 = [
    (("Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
     '{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```'
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"), "Let me check.", [("get_weather", '{"city": "Rome"}'), ("now", "{}")]),
    ("plain answer", "plain answer", []),
]


@pytest.mark.parametrize("parser,text,content,calls", [(HermesToolParser(), *c) for c in HERMES]
                         + [(DeepSeekV3ToolParser(), *c) for c in V3])
def test_whole_and_streamed_outputs_give_the_same_calls(parser, text, content, calls):
    assert parser.split(text) == (content, calls)
    for size in (1, 2, 3, 7, 16, len(text)):
        stream = ToolStream(parser)
        chunks = [text[i:i + size] for i in range(0, len(text), size)]
        got_content, got_calls = "", []
        for i, chunk in enumerate(chunks):
            c, new = stream.feed(chunk, final=i == len(chunks) - 1)
            got_content += c
            got_calls += [(x["function"]["name"], x["function"]["arguments"]) for x in new]
            assert [x["index"] for x in new] == list(range(len(got_calls) - len(new), len(got_calls)))
        assert (got_content, got_calls) == (content, calls), size


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


def _accepts(grammar: str, text: str) -> bool:
    info = xgr.TokenizerInfo([chr(c) for c in range(32, 127)] + ["\n", "｜", "▁"])  # (a vocabulary of characters)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar),
                                 terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


@pytest.mark.parametrize("parser", [HermesToolParser(), DeepSeekV3ToolParser()])
def test_the_tool_choice_grammar_accepts_exactly_calls_of_the_chosen_functions(parser):
    def call(name, args):
        pieces = parser.pieces(name, {})
        return pieces[0] + (json.dumps({"name": name, "arguments": args}) if len(pieces) == 3 and
                            isinstance(pieces[1], dict) and "name" in pieces[1].get("properties", {})
                            else json.dumps(args)) + pieces[2]

    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                tool_choice="required")
    required = tool_grammar(parser, req)
    assert _accepts(required, call("get_weather", {"city": "Paris", "days": 3}))
    assert _accepts(required, call("now", {}))
    assert not _accepts(required, call("get_weather", {"city": "Oslo", "days": 3}))
    assert not _accepts(required, "no call")
    named = tool_grammar(parser, req.model_copy(update={"tool_choice": {"type": "function",
                                                                       "function": {"name": "now"}}}))
    assert _accepts(named, call("now", {}))
    assert not _accepts(named, call("get_weather", {"city": "Paris", "days": 3}))


def test_parsers_are_found_by_name():
    assert load_parser(TOOL_GROUP, "hermes", "--tool-call-parser").name == "hermes"
    assert load_parser(TOOL_GROUP, "deepseek_v3", "--tool-call-parser").name == "deepseek_v3"
