"""The router's HTTP relay, against fake instances in-process: bodies and streams come back as the
instance sent them, conversations stay on their instance, an unreachable instance is a 502, and the
load counts return to zero."""
from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from deepinfer.router.app import Router, build_app

URLS = ["http://a:1", "http://b:2", "http://c:3"]


SEEN: dict[str, list[dict]] = {}


def _instance(name: str) -> FastAPI:
    app = FastAPI()
    SEEN[name] = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        SEEN[name].append(body)
        text = f"{name}:{len(body['messages'])}"
        if body.get("stream"):
            async def events():
                for piece in (text[:2], text[2:]):
                    yield f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return {"choices": [{"message": {"content": text}}], "auth": request.headers.get("authorization")}

    return app


class Fleet(httpx.AsyncBaseTransport):
    """Each URL's host to its fake instance; hosts in ``down`` refuse connections."""

    def __init__(self) -> None:
        self.apps = {u.split("//")[1].split(":")[0]: httpx.ASGITransport(_instance(u[7])) for u in URLS}
        self.down: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.apps[request.url.host].handle_async_request(request)


def _run(coro):
    return asyncio.run(coro)


async def _client(fleet: Fleet, **kw) -> tuple[httpx.AsyncClient, Router]:
    router = Router(URLS, transport=fleet, chunk_chars=16, **kw)
    return httpx.AsyncClient(transport=httpx.ASGITransport(build_app(router)), base_url="http://router"), router


def _conv(c: int, turns: int) -> list[dict]:
    msgs = [{"role": "user", "content": f"conversation {c} opens with a long question, " * 3}]
    for t in range(turns - 1):
        msgs += [{"role": "assistant", "content": f"answer {t}"}, {"role": "user", "content": f"more {t}"}]
    return msgs


def test_replies_and_streams_are_relayed_as_sent():
    async def go():
        client, router = await _client(Fleet())
        r = await client.post("/v1/chat/completions", json={"model": "m", "messages": _conv(0, 1)},
                              headers={"Authorization": "Bearer k"})
        inst = r.headers["x-deepinfer-instance"]
        assert r.status_code == 200 and r.json()["auth"] == "Bearer k"
        assert r.json()["choices"][0]["message"]["content"] == f"{'abc'[int(inst)]}:1"
        async with client.stream("POST", "/v1/chat/completions",
                                 json={"model": "m", "messages": _conv(0, 2), "stream": True}) as s:
            text = "".join([c async for c in s.aiter_text()])
        assert s.headers["x-deepinfer-instance"] == inst  # the later turn went where the first did
        assert s.headers["content-type"].startswith("text/event-stream") and text.endswith("data: [DONE]\n\n")
        assert "".join(json.loads(line[6:])["choices"][0]["delta"]["content"]
                       for line in text.split("\n\n") if line.startswith("data: {")) == f"{'abc'[int(inst)]}:3"
        assert router.loads == [0, 0, 0] and sum(router.routed) == 2
    _run(go())


def test_conversations_spread_then_stick():
    async def go():
        client, router = await _client(Fleet())
        homes = {}
        for turn in (1, 2, 3):
            for c in range(6):
                r = await client.post("/v1/chat/completions", json={"model": "m", "messages": _conv(c, turn)})
                homes.setdefault(c, r.headers["x-deepinfer-instance"])
                assert r.headers["x-deepinfer-instance"] == homes[c]
        assert sorted(homes.values()) == ["0", "0", "1", "1", "2", "2"] and router.routed == [6, 6, 6]
    _run(go())


def test_an_unreachable_instance_is_a_502_naming_it():
    async def go():
        fleet = Fleet()
        fleet.down = {"a", "b", "c"}
        client, router = await _client(fleet)
        r = await client.post("/v1/chat/completions", json={"model": "m", "messages": _conv(0, 1)})
        assert r.status_code == 502 and "failed: ConnectError" in r.json()["error"]["message"]
        assert router.loads == [0, 0, 0]
        r = await client.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400
    _run(go())


def test_disaggregated_requests_are_prefilled_then_continued_on_a_decode_instance():
    async def go():
        fleet = Fleet()
        router = Router(URLS[1:], transport=fleet, chunk_chars=16, prefill=URLS[:1])
        client = httpx.AsyncClient(transport=httpx.ASGITransport(build_app(router)), base_url="http://router")
        body = {"model": "m", "messages": _conv(0, 1), "stream": True, "max_tokens": 50, "min_tokens": 5,
                "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            text = "".join([c async for c in s.aiter_text()])
        decode = "bc"[int(s.headers["x-deepinfer-instance"])]
        assert text.endswith("data: [DONE]\n\n")
        first = SEEN["a"][-1]
        assert first["max_tokens"] == 1 and first["min_tokens"] == 0 and "stream" not in first
        assert first["messages"] == body["messages"] and SEEN[decode][-1] == body
        fleet.down = {"a"}  # a prefill instance down: a 502 naming it, and no decode instance asked
        asked = len(SEEN["b"]) + len(SEEN["c"])
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 502 and "prefill instance http://a:1 failed" in r.json()["error"]["message"]
        assert len(SEEN["b"]) + len(SEEN["c"]) == asked and router.loads == [0, 0] == router.prefill_loads + [0]
    _run(go())
