"""Requests generated from the server's own /openapi.json, valid and broken: none may get a 5xx.

Hypothesis draws bodies from each route's request schema (pydantic's JSON Schema: objects, anyOf,
arrays, bounds, enums, $refs); one in three then has a field replaced by an arbitrary JSON value,
dropped, or a stray one added, so that the errors' paths are driven too. The run is bounded to
about a minute.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # about 2,000 generated requests against a served app

BUDGET_S = 45.0

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(["hi", "import os", "\ud800", ""])


def from_schema(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """A strategy for JSON values that ``schema`` (a subset of JSON Schema, as pydantic writes it)
    describes; past a few levels, short ones."""
    if "$ref" in schema:
        return from_schema(components[schema["$ref"].rsplit("/", 1)[1]], components, depth)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(s, components, depth) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -2**31 - 1) + 1)
        high = schema.get("maximum", schema.get("exclusiveMaximum", 2**31 + 1) - 1)
        return st.integers(low, min(high, low + 4096)) | st.integers(low, high)
    if kind == "number":
        return st.floats(schema.get("minimum", schema.get("exclusiveMinimum")),
                         schema.get("maximum", schema.get("exclusiveMaximum")),
                         exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        return TEXT.filter(lambda s: schema.get("minLength", 0) <= len(s) <= schema.get("maxLength", 1 << 30))
    if kind == "array":
        items = from_schema(schema.get("items", {}), components, depth + 1)
        high = min(schema.get("maxItems", 4), 4 if depth < 2 else 1)
        return st.lists(items, min_size=min(schema.get("minItems", 0), high), max_size=high)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, components, depth + 1) for k, v in props.items() if k in required},
            optional={k: from_schema(v, components, depth + 1) for k, v in props.items() if k not in required})
    return JSON_VALUES


def broken(body: st.SearchStrategy) -> st.SearchStrategy:
    """A body with one field replaced by any JSON value, dropped, or a stray field added."""

    @st.composite
    def draw(draw_from) -> Any:
        value = draw_from(body)
        if not isinstance(value, dict) or not value:
            return value
        key = draw_from(st.sampled_from(sorted(value)))
        how = draw_from(st.sampled_from(["replace", "drop", "add"]))
        value = dict(value)
        if how == "replace":
            value[key] = draw_from(JSON_VALUES)
        elif how == "drop":
            del value[key]
        else:
            value[draw_from(st.text(min_size=1, max_size=8))] = draw_from(JSON_VALUES)
        return value

    return draw()


@pytest.fixture(scope="module")
def schema(server) -> dict[str, Any]:
    r = httpx.get(f"{server.base_url}/openapi.json", headers=server.headers, timeout=30)
    assert r.status_code == 200
    return r.json()


def test_generated_requests_never_get_a_5xx(server, schema):
    components = schema["components"]["schemas"]
    routes = []
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            body = from_schema(content["schema"], components) if content else st.none()
            if content is not None:  # (mostly the served model's name: the requests then go further in)
                named = body.map(lambda b: {**b, "model": "tiny"} if isinstance(b, dict) and "model" in b else b)
                body = st.one_of(named, named, body, broken(named))
            routes.append(st.tuples(st.just(method.upper()), st.just(path), body))
    assert {"/v1/completions", "/v1/chat/completions"} <= set(schema["paths"])
    start = time.monotonic()
    seen: dict[int, int] = {}
    client = httpx.Client(base_url=server.base_url, headers=server.headers, timeout=60)

    @settings(max_examples=2000, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(routes))
    def run(call: tuple[str, str, Any]) -> None:
        if time.monotonic() - start > BUDGET_S:
            return
        method, path, body = call
        if body is not None and isinstance(body, dict) and "max_tokens" not in body:
            body = {**body, "max_tokens": 4}  # (the engine's time goes to more requests, not long replies)
        content = None if body is None else json.dumps(body).encode()
        r = client.request(method, path, content=content, headers={"Content-Type": "application/json"})
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, f"{method} {path} {content!r}: {r.status_code} {r.text}"
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text

    run()
    client.close()
    print(f"{sum(seen.values())} requests in {time.monotonic() - start:.0f} s, by status: {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= 50, seen
    assert any(400 <= s < 500 for s in seen) and 200 in seen, seen
