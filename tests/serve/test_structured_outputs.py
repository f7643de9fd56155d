"""Structured outputs through the server, with the official openai client: ``response_format``
(json_schema, json_object) and vLLM's ``guided_regex``, ``guided_choice``, ``guided_grammar``.

Oracles: jsonschema validates every output against its schema; ``re.fullmatch`` the regex ones."""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow  # a real server on the demo model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "kind": {"type": "string", "enum": ["cat", "dog", "owl"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                    "vip": {"type": "boolean"}},
                  "required": ["id", "vip"], "additionalProperties": False},
    },
    "required": ["name", "kind", "age", "tags", "owner"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


@pytest.fixture(scope="module")
def demo_server():
    srv = ServerProcess(None, "--served-model-name", "demo", "--max-num-seqs", "64")
    yield srv
    srv.stop()


@pytest.fixture
def client(demo_server):
    return openai.AsyncOpenAI(base_url=f"{demo_server.base_url}/v1", api_key="none", max_retries=0, timeout=600)


async def _whole(client, seed: int) -> str:
    r = await client.chat.completions.create(model="demo", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                             temperature=1.0, seed=seed, max_tokens=200)
    assert r.choices[0].finish_reason == "stop"
    return r.choices[0].message.content


async def _streamed(client, seed: int) -> str:
    stream = await client.chat.completions.create(model="demo", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                                  temperature=1.0, seed=seed, max_tokens=200, stream=True)
    parts, finish = [], None
    async for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert finish == "stop"
    return "".join(parts)


def test_strict_json_schema_holds_on_100_of_100_sampled_requests(client):
    """Half of them streamed, half whole, all at once."""
    async def run():
        return await asyncio.gather(*[(_streamed if seed % 2 else _whole)(client, seed) for seed in range(100)])

    texts = asyncio.run(run())
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts[0::2])) > 10 and len(set(texts[1::2])) > 10  # (sampled: the outputs differ)


def test_json_object_regex_and_choice_are_obeyed(client):
    async def run():
        obj = await client.chat.completions.create(model="demo", messages=MESSAGES, temperature=0, max_tokens=200,
                                                   response_format={"type": "json_object"})
        rx = await client.completions.create(model="demo", prompt="id: ", temperature=1.0, seed=1, max_tokens=20,
                                             n=4, extra_body={"guided_regex": r"[A-Z]{2}-\d{4}"})
        choice = await client.chat.completions.create(model="demo", messages=MESSAGES, temperature=1.0, seed=2,
                                                      n=6, extra_body={"guided_choice": ["red", "green", "blue"]})
        return obj, rx, choice

    obj, rx, choice = asyncio.run(run())
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].message.content.startswith("{")
    assert all(re.fullmatch(r"[A-Z]{2}-\d{4}", c.text) for c in rx.choices)
    assert {c.message.content for c in choice.choices} <= {"red", "green", "blue"}


@pytest.mark.parametrize("body,param,words", [
    ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar", "missing_rule"),
    ({"guided_regex": "([a-z]"}, "guided_regex", "parenthesis"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", "nonsense"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "one structured-output constraint"),
])
def test_a_constraint_that_cannot_compile_is_a_400_naming_the_problem(client, body, param, words):
    async def run():
        return await client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8,
                                                    extra_body=body)

    with pytest.raises(openai.BadRequestError) as e:
        asyncio.run(run())
    err = e.value.body
    assert err["param"] == param and words in err["message"], err
