"""Tool calling and reasoning content through the server, with the official openai client.

A tiny model directory gets a Hermes-style chat template (written here); with ``--tool-call-parser
hermes`` its replies under ``tool_choice`` required or a named function are calls (enforced by the
grammar) whose arguments are valid JSON of the tool's schema (jsonschema is the oracle), streamed and
not, and a chat holding the call and a ``tool`` message renders as transformers renders it (the
prompt's token count is the oracle). With ``--reasoning-parser deepseek_r1`` a reply forced by a
regex to hold think tags comes back split into ``reasoning_content`` and ``content``."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.serve.conftest import ServerProcess
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # real servers

HERMES_TEMPLATE = """{%- if tools %}<|system|>Call a tool as <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call>
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "tool" %}<|user|><tool_response>
{{ m.content }}
</tool_response><|end|>
{% elif m.role == "assistant" and m.tool_calls %}<|assistant|>
{%- for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments }}}
</tool_call>
{%- endfor %}<|end|>
{% else %}<|{{ m.role }}|>{{ m.content }}<|end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("hermes-qwen3")
    make_model(path, "qwen3")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HERMES_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def tool_server(hermes_model):
    srv = ServerProcess(str(hermes_model), "--served-model-name", "tiny", "--tool-call-parser", "hermes")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reasoning_server(hermes_model):
    srv = ServerProcess(str(hermes_model), "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1")
    yield srv
    srv.stop()


def _client(srv):
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=300)


def _check_calls(calls, names):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("choice,names", [("required", set(SCHEMAS)), (NAMED, {"get_weather"})])
def test_enforced_tool_choice_gives_tool_calls_with_valid_arguments(tool_server, choice, names):
    r = _client(tool_server).chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                                     tool_choice=choice, temperature=1.0, seed=3, n=3,
                                                     max_tokens=300)
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        _check_calls(c.message.tool_calls, names)


@pytest.mark.parametrize("choice,names", [("required", set(SCHEMAS)), (NAMED, {"get_weather"})])
def test_streamed_tool_calls_arrive_as_deltas_and_match_the_whole_reply(tool_server, choice, names):
    kw = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "temperature": 1.0,
          "seed": 5, "max_tokens": 300}
    client = _client(tool_server)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, finish = [], None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [c.index for c in calls] == list(range(len(calls)))


def test_a_tool_message_round_trip_renders_as_transformers_renders_it(tool_server, hermes_model):
    from transformers import AutoTokenizer

    client = _client(tool_server)
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
                                           temperature=0, max_tokens=300).choices[0].message
    call = first.tool_calls[0]
    chat = [*MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'}]
    r = client.chat.completions.create(model="tiny", messages=chat, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=5)
    assert r.choices[0].message.tool_calls is None
    tok = AutoTokenizer.from_pretrained(hermes_model)
    rendered = tok.apply_chat_template(chat, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tool_response>\n{\"forecast\": \"sunny\"}" in rendered and call.function.arguments in rendered
    assert r.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])


def test_tools_without_a_parser_or_with_an_unknown_function_are_400(tool_server, reasoning_server):
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        _client(reasoning_server).chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        _client(tool_server).chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}})


THINK = r"<think>([a-z ]{1,16})</think>([a-z]{1,8})"


def test_reasoning_content_is_split_from_the_reply_whole_and_streamed(reasoning_server):
    client = _client(reasoning_server)
    kw = {"model": "tiny", "messages": MESSAGES, "temperature": 1.0, "seed": 11, "max_tokens": 60,
          "extra_body": {"guided_regex": THINK}}
    whole = client.chat.completions.create(**kw).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert re.fullmatch(r"[a-z ]{1,16}", reasoning) and re.fullmatch(r"[a-z]{1,8}", whole.content)
    thought, text = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            thought.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            text.append(c.delta.content or "")
            assert "<think>" not in text[-1] and "</think>" not in thought[-1]
    assert ("".join(thought), "".join(text)) == (reasoning, whole.content)
