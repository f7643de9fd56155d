"""In-process parts of issue 66: an unhandled exception becomes a JSON 500 on a connection that stays
usable, and a role the chat template cannot render gets a 400 that says so."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi import FastAPI

from deepinfer.core.tokenizer import Tokenizer
from deepinfer.serve.app import Guard
from deepinfer.serve.chat import _render
from deepinfer.serve.http import protocol_with_header_timeout
from deepinfer.serve.metrics import ServerMetrics
from deepinfer.serve.protocol import APIError, ChatCompletionRequest
from tests.serve.conftest import free_port
from tests.serve.test_hardening import raw_exchange


@pytest.fixture(scope="module")
def failing_app():
    """uvicorn serving a route that raises (its message holds text JSON cannot encode) and one that works."""
    app = FastAPI()
    metrics = ServerMetrics()
    app.add_middleware(Guard, api_key=None, max_body_bytes=1 << 20, metrics=metrics)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("broke on \ud800")

    @app.get("/ok")
    async def ok():
        return {"ok": True}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           http=protocol_with_header_timeout(10.0), lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield port, metrics
    server.should_exit = True
    thread.join(10)


def test_an_unhandled_exception_is_a_json_500_and_the_connection_stays_usable(failing_app):
    port, metrics = failing_app
    get = f"GET /%s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # (twice on one connection)
            status, headers, body = raw_exchange(sock, (get % "boom").encode())
            assert status == 500 and headers["content-type"] == "application/json"
            err = json.loads(body)["error"]
            assert err["type"] == "server_error" and err["code"] == "internal_error"
            assert "RuntimeError" in err["message"] and "\\ud800" in err["message"]
            assert raw_exchange(sock, (get % "ok").encode())[:1] == (200,)
    assert metrics.errors.labels(status="500")._value.get() == 2


STRICT = ("{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
          "{{ raise_exception('Conversation roles must be system, user or assistant') }}{% endif %}"
          "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _serving(model_dir, template: str) -> SimpleNamespace:
    tok = Tokenizer(model_dir)
    tok.chat_template = template
    return SimpleNamespace(tokenizer=tok, template_roles={}, require_tokenizer=lambda: tok,
                           limits=SimpleNamespace(max_chat_messages=16), check_text_length=lambda n, p: None)


@pytest.mark.parametrize("role", ["developer", "tool"])
def test_a_role_the_template_cannot_render_is_a_400_saying_so(tiny_model, role):
    serving = _serving(tiny_model, STRICT)
    req = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"},
                                                        {"role": role, "content": "x"}])
    with pytest.raises(APIError) as e:
        asyncio.run(_render(serving, req))
    assert e.value.status == 400 and e.value.param == "messages" and e.value.code == "unsupported_role"
    assert f"cannot render messages with the role '{role}'" in e.value.message
    assert "'system', 'user', 'assistant'" in e.value.message
    # a template error that is not about a role keeps the template's own words
    serving = _serving(tiny_model, "{{ raise_exception('no chats today') }}")
    with pytest.raises(APIError) as e:
        asyncio.run(_render(serving, ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "x"}])))
    assert "no chats today" in e.value.message


@pytest.mark.parametrize("bos", [False, True])
def test_encode_many_gives_what_encode_gives(tiny_model, bos):
    """The batch call that long prompts go through (it releases the GIL) tokenizes as ``encode``."""
    tok = Tokenizer(tiny_model)
    tok.add_bos_token = bos
    tok.bos_token_id = tok.bos_token_id if tok.bos_token_id is not None else 1
    texts = ["The quick brown fox. " * 300, "import os\n", "", "<|user|>hi<|end|>"]
    for special in (True, False):
        assert tok.encode_many(texts, special) == [tok.encode(t, special) for t in texts]
