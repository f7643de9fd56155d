"""/metrics, client disconnects and the waiting-queue limit, on the shared server."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx

from tests.serve.conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"model": "tiny", "prompt": "import os", "max_tokens": 240, "temperature": 0, "ignore_eos": True}


def test_metrics_expose_latencies_token_counters_and_kv_usage(server, client):
    before = server.wait_idle()
    r = client.completions.create(model="tiny", prompt="hello world", max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    after = server.wait_idle()
    assert after["deepinfer:prompt_tokens_total"] - before["deepinfer:prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["deepinfer:generation_tokens_total"] - before["deepinfer:generation_tokens_total"] == 7
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        name = f"deepinfer:{hist}_count"
        assert after[name] > before.get(name, 0)
    itl = "deepinfer:inter_token_latency_seconds_count"
    assert after[itl] - before[itl] == 6  # 7 tokens: one first token, six gaps
    assert after["deepinfer:kv_cache_usage"] == 0.0
    assert after["deepinfer:kv_cache_free_blocks"] == after["deepinfer:kv_cache_total_blocks"] > 0
    assert "deepinfer:num_preemptions_total" in after  # registered by the fcfs scheduler plugin
    assert all(k.startswith("deepinfer:") for k in after)


def _start_stream(server, body: dict) -> tuple[httpx.Client, httpx.Response]:
    c = httpx.Client(timeout=30)
    req = c.build_request("POST", f"{server.base_url}/v1/completions", headers=HEADERS,
                          json={**body, "stream": True})
    return c, c.send(req, stream=True)


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = server.wait_idle()
    c, resp = _start_stream(server, LONG)
    lines = resp.iter_lines()
    got = [next(lines) for _ in range(6)]  # a few events in: the request is running
    assert any(line.startswith("data: {") for line in got)
    resp.close()
    c.close()
    after = server.wait_idle()
    assert after["deepinfer:request_aborted_total"] - before["deepinfer:request_aborted_total"] == 1
    generated = after["deepinfer:generation_tokens_total"] - before["deepinfer:generation_tokens_total"]
    assert 0 < generated < LONG["max_tokens"]
    assert after["deepinfer:kv_cache_free_blocks"] == after["deepinfer:kv_cache_total_blocks"]


def test_client_disconnect_before_a_non_streamed_reply_aborts(server):
    before = server.wait_idle()
    body = json.dumps({**LONG, "n": 4}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + body)
        time.sleep(0.05)  # well before 4 x 240 tokens are done
    after = server.wait_idle()
    assert after["deepinfer:request_aborted_total"] - before["deepinfer:request_aborted_total"] == 1
    assert after["deepinfer:generation_tokens_total"] - before["deepinfer:generation_tokens_total"] < 4 * 240
    assert after["deepinfer:kv_cache_free_blocks"] == after["deepinfer:kv_cache_total_blocks"]


def test_full_queue_gets_503_with_retry_after_and_recovers(server):
    # the server admits 4 running + 4 waiting sequences; the streams start together (a waiting
    # request's headers may only come once it runs), and the 9th request goes in while the engine
    # holds all eight: the four waiting ones cannot start before the four running ones end
    server.wait_idle()
    streams: list = []
    threads = [threading.Thread(target=lambda: streams.append(_start_stream(server, LONG))) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        m = server.metrics()
        while m["deepinfer:num_requests_running"] + m["deepinfer:num_requests_waiting"] < 8:
            assert time.monotonic() < deadline, m
            time.sleep(0.005)
            m = server.metrics()
        r = httpx.post(f"{server.base_url}/v1/completions", headers=HEADERS, timeout=30,
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "overloaded"
        m = server.metrics()
        assert m["deepinfer:http_requests_rejected_total"] >= 1
    finally:
        for t in threads:
            t.join(timeout=60)
        for c, resp in streams:
            assert resp.status_code == 200
            resp.close()
            c.close()
    m = server.wait_idle()
    assert m["deepinfer:kv_cache_free_blocks"] == m["deepinfer:kv_cache_total_blocks"]
    ok = httpx.post(f"{server.base_url}/v1/completions", headers=HEADERS, timeout=30,
                    json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_api_stays_responsive_while_the_engine_is_busy(server):
    """/health answers fast while 4 long generations keep the engine stepping."""
    server.wait_idle()
    results: list[int] = []

    def generate() -> None:
        r = httpx.post(f"{server.base_url}/v1/completions", headers=HEADERS, timeout=120,
                       json={**LONG, "max_tokens": 200})
        results.append(json.loads(r.text)["usage"]["completion_tokens"])

    threads = [threading.Thread(target=generate) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        worst = 0.0
        for _ in range(10):
            t0 = time.perf_counter()
            assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
            worst = max(worst, time.perf_counter() - t0)
        assert worst < 1.0
    finally:
        for t in threads:
            t.join(120)
    assert results == [200] * 4
