"""Issue 66 on the shared server: out-of-range sampling values, invalid text, keep-alive after errors,
errors counted, the bearer scheme, what /v1/models and /openapi.json show."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.serve.conftest import API_KEY
from tests.serve.test_errors import CHAT, COMPLETION, assert_error, post


def raw_exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one HTTP/1.1 request on an open socket and read its whole response (Content-Length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection; got {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def http_request(path: str, body: bytes, port: int, key: str | None = API_KEY) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize("value", [1e-40, 1e-38, 0.0, 11.0])
def test_a_repetition_penalty_out_of_range_is_400_with_the_range(server, path, body, value):
    err = assert_error(post(server, path, {**body, "repetition_penalty": value}), 400, "repetition_penalty")
    assert "[0.01, 10]" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", b'{"model": "tiny", "prompt": "ab\\ud800cd", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "ok", "stop": ["\\ud800"], "max_tokens": 2}', "stop"),
    ("/v1/completions", b'{"model": "\\ud800", "prompt": "ok"}', "model"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages"),
    ("/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "a\\ud800"}]}]}',
     "messages"),
])
def test_a_lone_surrogate_is_400_naming_the_field_and_the_connection_stays_usable(server, path, body, param):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        status, headers, raw = raw_exchange(sock, http_request(path, body, server.port))
        assert status == 400, raw
        err = json.loads(raw)["error"]
        assert err["param"] == param and "not valid Unicode" in err["message"]
        assert headers.get("connection", "").lower() != "close"
        ok = json.dumps(COMPLETION).encode()  # the same connection serves the next request
        status, _, raw = raw_exchange(sock, http_request("/v1/completions", ok, server.port))
        assert status == 200, raw


def _errors(server, status: int) -> float:
    return server.metrics().get(f"deepinfer:http_request_errors_total[('status', '{status}')]", 0.0)


def test_401_and_413_are_counted_as_errors(server):
    before_401, before_413 = _errors(server, 401), _errors(server, 413)
    r = httpx.post(f"{server.base_url}/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer no"})
    assert r.status_code == 401
    assert post(server, "/v1/completions", {**COMPLETION, "prompt": "x" * 70_000}).status_code == 413
    assert _errors(server, 401) == before_401 + 1
    assert _errors(server, 413) == before_413 + 1


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_bearer_scheme_is_case_insensitive(server, scheme):
    r = httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"}, timeout=10)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("header", [f"Basic {API_KEY}", f"Bearer {API_KEY}x", f"Bearer{API_KEY}", ""])
def test_other_schemes_and_keys_are_still_refused(server, header):
    r = httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": header} if header else {}, timeout=10)
    assert r.status_code == 401


def test_models_shows_the_served_name_and_no_path(server, tiny_model):
    r = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=10)
    assert r.status_code == 200
    card = r.json()["data"][0]
    assert card["id"] == "tiny" and card["root"] == "tiny"
    assert str(tiny_model) not in r.text and tiny_model.name not in r.text


def test_openapi_schema_is_served_behind_the_key(server):
    assert httpx.get(f"{server.base_url}/openapi.json", timeout=10).status_code == 401
    r = httpx.get(f"{server.base_url}/openapi.json", headers=server.headers, timeout=10)
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(paths)
