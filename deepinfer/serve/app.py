"""The FastAPI application: routes, the API-key and body-size guard, and OpenAI-style errors."""
from __future__ import annotations

import asyncio
import ctypes
import hmac
import json
import logging
import traceback
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deepinfer.serve.body import read_body
from deepinfer.serve.chat import create_chat_completion
from deepinfer.serve.completions import create_completion
from deepinfer.serve.engine_client import EngineClient
from deepinfer.serve.metrics import ServerMetrics
from deepinfer.serve.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    valid_range,
)
from deepinfer.serve.serving import ClientDisconnected, Serving

log = logging.getLogger("deepinfer.serve")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP-side options of ``deepinfer serve``."""

    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    engine_shutdown_timeout: float = 10.0


class BodyTooLarge(HTTPException):
    """The request body passed ``--max-body-bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds {limit} bytes; send a smaller request")


def _error(status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(APIError(status, message, type, code=code).body(), status_code=status, headers=headers)


#: a request body at least this large gives its memory back to the system once answered
_TRIM_AFTER_BYTES = 1 << 20


def _trim_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps them otherwise: a few large
    requests would leave the API process gigabytes larger for good)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def bearer_matches(header: bytes, key: bytes) -> bool:
    """Whether an Authorization header carries ``key`` as a bearer token (the scheme's name is
    case-insensitive, RFC 9110)."""
    scheme, _, token = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


class Guard:
    """ASGI middleware in front of every route: bearer-token check on /v1/*, /metrics and
    /openapi.json, body limit, errors counted, and an unhandled exception answered as a JSON 500
    (the connection stays usable)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.limit = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.key is not None and (path.startswith("/v1") or path in ("/metrics", "/openapi.json")):
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not bearer_matches(got, self.key):
                self.metrics.errors.labels(status="401").inc()
                await _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.limit:
            self.metrics.errors.labels(status="413").inc()
            await _error(413, f"the request body exceeds {self.limit} bytes; send a smaller request",
                         code="request_too_large")(scope, receive, send)
            return
        seen = 0
        limit = self.limit
        started = False

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:  # a chunked body has no Content-Length to check up front
                    raise BodyTooLarge(limit)
            return msg

        async def tracked_send(msg):
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except Exception as e:
            if started:
                raise  # (uvicorn closes the connection: the response cannot be completed)
            self.metrics.errors.labels(status="500").inc()
            # (the traceback with any text that UTF-8 cannot encode escaped: a log file or a test
            # runner's pipe would otherwise fail on it, the bug it reports)
            trace = "".join(traceback.format_exception(e)).encode("utf-8", "backslashreplace").decode("utf-8")
            log.error("internal error while serving %s\n%s", ascii(path)[1:-1], trace)
            # (ascii(): a message may hold text that JSON could not encode, the bug it reports)
            await _error(500, f"internal error: {type(e).__name__}: {ascii(str(e))[1:-1]}", "server_error",
                         code="internal_error")(scope, receive, send)
        finally:
            if seen >= _TRIM_AFTER_BYTES:
                await asyncio.to_thread(_trim_memory)


def build_app(client: EngineClient, serving: Serving, metrics: ServerMetrics, settings: ServerSettings) -> FastAPI:
    """The server's ASGI app; ``client`` has already started its engine."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client.attach(asyncio.get_running_loop())
        try:
            yield
        finally:
            serving.draining = True
            client.shutdown(settings.engine_shutdown_timeout)

    # /openapi.json: the schema clients and fuzzers read (behind the API key when one is set)
    app = FastAPI(title="deepinfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.add_middleware(Guard, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes, metrics=metrics)
    _add_error_handlers(app, metrics)

    @app.get("/health")
    async def health() -> Response:
        if not client.alive:
            return _error(503, f"the engine is not running: {client.dead or 'stopped'}", "server_error")
        if serving.draining:
            return _error(503, "the server is shutting down", "server_error", code="shutting_down")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        snapshot = await client.stats()
        if snapshot is not None:
            metrics.update_engine(snapshot)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        # the served name only: the model's path on this machine is no business of its clients
        name = serving.model_names[0]
        return ModelList(data=[ModelCard(id=name, root=name, max_model_len=serving.max_model_len)])

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await create_completion(serving, await read_body(request, CompletionRequest, serving), request)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat(request: Request) -> Response:
        return await create_chat_completion(serving, await read_body(request, ChatCompletionRequest, serving),
                                            request)

    _with_body_schemas(app, (CompletionRequest, ChatCompletionRequest))
    return app


def _body_schema(model: type) -> dict:
    """The request body's place in the OpenAPI document (the routes read their bodies themselves)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def _with_body_schemas(app: FastAPI, models: tuple[type, ...]) -> None:
    """Add the request bodies' schemas to /openapi.json, where ``_body_schema`` points."""
    default = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = default()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


_REQUEST_MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def counted(status: int) -> None:
        metrics.errors.labels(status=str(status)).inc()

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> Response:
        counted(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> Response:
        counted(400)
        errs = e.errors()
        err = errs[0] if errs else {}
        paths = [[str(x) for x in er.get("loc", ()) if x != "body"] for er in errs]
        loc = paths[0] if paths else []
        if len(paths) > 1 and loc and all(p[:1] == loc[:1] for p in paths):
            loc = loc[:1]  # every member of a union failed: name the field, not pydantic's member tags
        param = ".".join(loc) or None
        if err.get("type") == "json_invalid":
            msg = f"the body is not valid JSON: {err.get('ctx', {}).get('error', 'decode error')}"
            param = None
        elif err.get("type") == "missing" and not loc:
            msg = "the request needs a JSON body"
        else:
            msg = f"{param}: {err.get('msg', 'invalid value')}" if param else err.get("msg", "invalid request")
            model = _REQUEST_MODELS.get(request.url.path)
            if (err.get("type") in _RANGE_ERRORS and model is not None and len(loc) == 1
                    and (bounds := valid_range(model, loc[0])) is not None):
                msg += f" (valid: {bounds})"
            if len(errs) > 1:
                msg += f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})"
        return JSONResponse(APIError(400, msg, param=param).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Response:
        counted(e.status_code)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status_code)
        detail = e.detail if isinstance(e.detail, str) else json.dumps(e.detail)
        return JSONResponse(APIError(e.status_code, detail, code=code).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(ClientDisconnected)
    async def gone(request: Request, e: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"

