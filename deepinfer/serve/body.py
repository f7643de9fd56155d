"""Reading a request's JSON body: sizes checked before validation, then the model, then its text.

FastAPI would validate the whole body before the route runs: 100,000 chat messages took 3 s of the
event loop that way, only to be refused for length. Here the cheap bounds (``RequestLimits``) are
checked on the parsed JSON first, and only a body within them is validated.
"""
from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from deepinfer.serve.protocol import APIError, invalid_text
from deepinfer.serve.serving import Serving

M = TypeVar("M", bound=BaseModel)
# a JSON escape of a UTF-16 surrogate: the only way a lone one gets into a parsed string (a raw
# one is not UTF-8, which the parser refuses)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


async def read_body(request: Request, model: type[M], serving: Serving) -> M:
    """The body as ``model``: a 400 for invalid JSON, a body past a limit, a validation error
    (through the app's RequestValidationError handler) or invalid text."""
    raw = await request.body()
    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error",
                                       "ctx": {"error": str(e)}}]) from None
    if isinstance(data, dict):
        _check_sizes(data, serving)
    if _SURROGATE_ESCAPE.search(raw) and (bad := invalid_text(data, "")) is not None:
        where = bad.lstrip(".")
        param = re.split(r"[.\[ ]", where, maxsplit=1)[0]
        raise APIError(400, f"{where} is not valid Unicode text (it holds a lone UTF-16 surrogate, such as an "
                       "unpaired \\ud800); send UTF-8 text", param=param, code="invalid_text")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


def _check_sizes(data: dict[str, Any], serving: Serving) -> None:
    """The bounds that can be read off the JSON before validating it: how many messages, prompts
    and token ids (``RequestLimits``)."""
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > serving.limits.max_chat_messages:
        raise APIError(400, f"messages has {len(messages)} entries; this server takes at most "
                       f"{serving.limits.max_chat_messages} (--max-chat-messages)", param="messages",
                       code="limit_exceeded")
    prompt = data.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return
    if isinstance(prompt[0], int):
        serving.check_token_ids(len(prompt))
        return
    n = data.get("n", 1)
    if len(prompt) > serving.max_in_flight_seqs:  # (with n, checked again once valid)
        serving.check_n(n if isinstance(n, int) and n > 0 else 1, len(prompt))
    for p in prompt:
        if isinstance(p, list):
            serving.check_token_ids(len(p))
