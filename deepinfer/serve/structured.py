"""A request's structured-output fields (OpenAI's ``response_format``, vLLM's ``guided_*``) as one
``StructuredOutputsParams``, checked to compile before the request reaches the engine."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from deepinfer.core.grammar import GrammarError, parse
from deepinfer.core.sampling_params import StructuredOutputsParams
from deepinfer.serve.protocol import APIError, SamplingFields

#: vLLM's request fields -> StructuredOutputsParams' (guided_json: a schema)
_GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def _response_format(rf: dict[str, Any]) -> dict[str, Any] | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict | bool):
            raise APIError(400, "response_format.json_schema.schema is missing: give the JSON schema the output "
                           "must follow ({\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": "
                           "{...}}})", param="response_format")
        schema = spec["schema"]
        return {"json_schema": schema if isinstance(schema, dict) else {}}
    raise APIError(400, f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                   param="response_format")


def structured_outputs(req: SamplingFields) -> StructuredOutputsParams | None:
    """The constraint the request asks for (None: none); a 400 naming the field when it asks for
    more than one, or when its schema, expression or grammar cannot be compiled."""
    given: dict[str, dict[str, Any]] = {}
    if req.response_format is not None and (rf := _response_format(req.response_format)) is not None:
        given["response_format"] = rf
    for name, key in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            given[name] = {key: value}
    if not given:
        return None
    if len(given) > 1:
        raise APIError(400, f"give one structured-output constraint, not {len(given)} ({', '.join(given)})",
                       param=next(iter(given)))
    (param, fields), = given.items()
    try:
        spec = StructuredOutputsParams(**fields)
        parse(spec)
    except (GrammarError, ValidationError) as e:
        message = str(e) if isinstance(e, GrammarError) else e.errors(include_url=False)[0]["msg"]
        raise APIError(400, f"{param}: {message}", param=param, code="invalid_grammar") from None
    return spec
