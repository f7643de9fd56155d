"""Every invalid request gets its 4xx with an OpenAI error object, and the server keeps serving."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.serve.conftest import API_KEY

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 40  # > 256 tokens


def post(server, path: str, body=None, content: bytes | None = None, headers=None) -> httpx.Response:
    h = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json", **(headers or {})}
    data = content if content is not None else json.dumps(body).encode()
    return httpx.post(f"{server.base_url}{path}", content=data, headers=h, timeout=30)


def assert_error(r: httpx.Response, status: int, param: str | None = "<any>") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param != "<any>":
        assert err["param"] == param
    return err


@pytest.fixture(autouse=True)
def still_healthy(server):
    yield
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
    ok = post(server, "/v1/completions", COMPLETION)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_json_is_400(server, path):
    err = assert_error(post(server, path, content=b'{"model": "tiny", "prompt": '), 400, None)
    assert "JSON" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {**COMPLETION, "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "prompt": {"text": "hi"}}, None),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, None),
    ("/v1/completions", {"prompt": "no model"}, "model"),
])
def test_wrong_types_are_400(server, path, body, param):
    err = assert_error(post(server, path, body), 400)
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param)



@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize("value", [-1, 0])
def test_non_positive_max_tokens_is_400(server, path, body, value):
    assert_error(post(server, path, {**body, "max_tokens": value}), 400, "max_tokens")


@pytest.mark.parametrize("path,body,field", [("/v1/completions", COMPLETION, "max_tokens"),
                                             ("/v1/chat/completions", CHAT, "max_tokens"),
                                             ("/v1/chat/completions", CHAT, "max_completion_tokens")])
def test_max_tokens_beyond_the_context_is_400(server, path, body, field):
    err = assert_error(post(server, path, {**body, field: 10**9}), 400, field)
    assert "256" in err["message"]
    assert_error(post(server, path, {**body, field: 255}), 400, field)  # prompt + 255 > 256


def test_empty_messages_is_400(server):
    assert_error(post(server, "/v1/chat/completions", {**CHAT, "messages": []}), 400, "messages")


@pytest.mark.parametrize("prompt", ["", [], [[]]])
def test_empty_prompt_is_400(server, prompt):
    assert_error(post(server, "/v1/completions", {**COMPLETION, "prompt": prompt}), 400)


def test_unknown_model_is_404(server):
    err = assert_error(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found" and "tiny" in err["message"]


@pytest.mark.parametrize("path,body", [("/v1/completions", {**COMPLETION, "prompt": LONG_PROMPT}),
                                       ("/v1/chat/completions",
                                        {**CHAT, "messages": [{"role": "user", "content": LONG_PROMPT}]})])
def test_prompt_longer_than_the_context_is_400(server, path, body):
    err = assert_error(post(server, path, body), 400)
    assert err["code"] == "context_length_exceeded"


def test_token_ids_outside_the_vocabulary_are_400(server):
    assert_error(post(server, "/v1/completions", {**COMPLETION, "prompt": [1, 2, 10**6]}), 400, "prompt")


@pytest.mark.parametrize("extra,param", [({"top_p": 0}, "top_p"), ({"temperature": -1}, "temperature"),
                                         ({"n": 0}, "n"), ({"stop": [""]}, "stop"), ({"seed": -5}, "seed"),
                                         ({"stop": ["s"] * 17}, "stop"), ({"stop": "z" * 300}, "stop"),
                                         ({"presence_penalty": 9}, "presence_penalty"),
                                         ({"cache_salt": ""}, "cache_salt"),
                                         ({"logit_bias": {"5": 1.0}}, "logit_bias"),
                                         ({"top_logprobs": 3}, "top_logprobs")])
def test_out_of_range_sampling_fields_are_400(server, extra, param):
    assert_error(post(server, "/v1/chat/completions", {**CHAT, **extra}), 400, param)


def test_oversized_body_is_413(server):
    body = {**COMPLETION, "prompt": "x" * 70_000}
    err = assert_error(post(server, "/v1/completions", body), 413)
    assert err["code"] == "request_too_large"


def test_oversized_chunked_body_is_413(server):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(80):
            yield b"y" * 1000
        yield b'"}'

    r = httpx.post(f"{server.base_url}/v1/completions", content=chunks(), timeout=30,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert_error(r, 413)


def test_unknown_route_is_404_in_openai_shape(server):
    assert_error(post(server, "/v1/embeddings", {"model": "tiny", "input": "x"}), 404)


@pytest.mark.parametrize("path", ["/v1/models", "/metrics"])
def test_missing_or_wrong_api_key_is_401(server, path):
    url = f"{server.base_url}{path}"
    assert_error(httpx.get(url, timeout=10), 401)
    assert_error(httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=10), 401)
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).status_code == 200


def test_wrong_api_key_is_401_for_the_openai_client(server):
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(**CHAT)
    assert e.value.status_code == 401


def test_health_needs_no_key(server):
    assert httpx.get(f"{server.base_url}/health", timeout=5).json() == {"status": "ok"}


@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_stream_options_without_stream_is_400(server, path, body):
    err = assert_error(post(server, path, {**body, "stream_options": {"include_usage": True}}), 400)
    assert "stream_options" in err["message"] and "stream" in err["message"]
