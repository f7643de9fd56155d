"""The router's HTTP side: FastAPI in front, httpx to the instances; bodies and streams are relayed
as they are, and a request's instance is chosen by its prompt's prefix and the instances' load."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from deepinfer.router.policy import POLICIES, prefix_chain

RELAYED_HEADERS = ("authorization", "content-type", "accept")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "router_error", "code": status}}, status)


class Router:
    """The instances, their load (requests relayed and not yet finished) and the routing policy."""

    def __init__(self, urls: Sequence[str], policy: str = "cache-aware", threshold: int = 4,
                 chunk_chars: int = 64, timeout: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None, prefill: Sequence[str] = ()) -> None:
        if not urls:
            raise ValueError("the router needs at least one instance URL (--instances URL,URL,...)")
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; valid: {', '.join(POLICIES)}")
        self.urls = [u.rstrip("/") for u in urls]
        self.loads = [0] * len(self.urls)
        self.routed = [0] * len(self.urls)
        self.policy = POLICIES[policy](len(self.urls), threshold=threshold)
        self.chunk_chars = chunk_chars
        # disaggregated: ``urls`` are decode instances, each request first prefilled on one of these
        self.prefill_urls = [u.rstrip("/") for u in prefill]
        self.prefill_loads = [0] * len(self.prefill_urls)
        self.prefill_policy = POLICIES[policy](len(self.prefill_urls), threshold=threshold) if prefill else None
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), transport=transport)

    def choose(self, body: object) -> int:
        return self.policy.choose(self._chain(body), self.loads)

    def _chain(self, body: object) -> list[bytes]:
        return prefix_chain(body, self.chunk_chars) if isinstance(body, dict) else []

    async def prefill(self, body: dict, path: str, headers: dict[str, str]) -> Response | None:
        """Have a prefill instance compute the prompt's KV (into the store the decode instances read);
        None when done, else the error reply."""
        i = self.prefill_policy.choose(self._chain(body), self.prefill_loads)
        one = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
        one.update(max_tokens=1, min_tokens=0, n=1)
        self.prefill_loads[i] += 1
        try:
            r = await self.client.post(self.prefill_urls[i] + path, json=one, headers=headers)
        except httpx.HTTPError as e:
            return _error(502, f"prefill instance {self.prefill_urls[i]} failed: {type(e).__name__}: {e}")
        finally:
            self.prefill_loads[i] -= 1
        if r.status_code != 200:
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        return None

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON")
        headers = {k: v for k, v in request.headers.items() if k.lower() in RELAYED_HEADERS}
        if self.prefill_policy is not None and isinstance(body, dict):
            failed = await self.prefill(body, path, headers)
            if failed is not None:
                return failed
        i = self.choose(body)
        upstream = self.client.build_request("POST", self.urls[i] + path, content=raw, headers=headers)
        self.loads[i] += 1
        self.routed[i] += 1
        try:
            resp = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as e:
            self.loads[i] -= 1
            return _error(502, f"instance {self.urls[i]} failed: {type(e).__name__}: {e}")
        streaming = isinstance(body, dict) and bool(body.get("stream"))
        out = {"x-deepinfer-instance": str(i)}
        if ct := resp.headers.get("content-type"):
            out["content-type"] = ct
        return StreamingResponse(self._relay(i, resp, streaming), status_code=resp.status_code, headers=out)

    async def _relay(self, i: int, resp: httpx.Response, streaming: bool) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as e:  # the instance died mid-reply: an error event, or a cut connection
            if not streaming:
                raise
            msg = {"error": {"message": f"instance {self.urls[i]} failed mid-stream: {type(e).__name__}",
                             "type": "router_error", "code": 502}}
            yield f"data: {json.dumps(msg)}\n\n".encode()
        finally:
            await resp.aclose()
            self.loads[i] -= 1

    async def models(self) -> Response:
        last = None
        for url in self.urls:
            try:
                r = await self.client.get(url + "/v1/models")
                return Response(r.content, r.status_code, media_type="application/json")
            except httpx.HTTPError as e:
                last = e
        return _error(502, f"no instance answered /v1/models: {last}")

    def metrics(self) -> str:
        lines = ["# TYPE deepinfer_router_requests counter", "# TYPE deepinfer_router_in_flight gauge"]
        for i, url in enumerate(self.urls):
            lines.append(f'deepinfer_router_requests_total{{instance="{url}"}} {self.routed[i]}')
            lines.append(f'deepinfer_router_in_flight{{instance="{url}"}} {self.loads[i]}')
        return "\n".join(lines) + "\n"


def build_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await router.client.aclose()

    app = FastAPI(title="deepinfer router", lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await router.forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await router.forward(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> Response:
        return await router.models()

    @app.get("/health")
    async def health() -> dict:
        return {"instances": router.urls, "in_flight": router.loads, "prefill": router.prefill_urls}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(router.metrics())

    return app
