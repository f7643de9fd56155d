"""``POST /v1/completions``: prompts in, text completions out, whole or streamed."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from deepinfer.serve.outputs import ChoiceText, EventStream, collect, sse, stream_events
from deepinfer.serve.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from deepinfer.serve.serving import Serving, Submission


async def _prompts(serving: Serving, req: CompletionRequest) -> list[list[int]]:
    p = req.prompt
    if isinstance(p, str):
        return [await serving.encode(p, True)]
    if all(isinstance(x, int) for x in p):
        return [list(p)]
    if all(isinstance(x, str) for x in p):
        return [await serving.encode(x, True) for x in p]
    return [list(x) for x in p]


def _logprobs(serving: Serving, entries: list[dict[int, float]] | None, offset: int) -> CompletionLogprobs | None:
    """OpenAI's legacy format; ``top_logprobs`` holds the sampled token and the k most likely."""
    if entries is None:
        return None
    out = CompletionLogprobs()
    for e in entries:
        token, lp = next(iter(e.items()))
        s = serving.token_str(token)
        out.tokens.append(s)
        out.token_logprobs.append(lp)
        top: dict[str, float] = {}
        for t, v in e.items():  # distinct ids may share a string (partial UTF-8): keep the likeliest
            top.setdefault(serving.token_str(t), v)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(s)
    return out


async def create_completion(serving: Serving, req: CompletionRequest, raw: Request) -> Response:
    model = serving.check_model(req.model)
    serving.check_supported(req)
    prompts = await _prompts(serving, req)
    for ids in prompts:
        serving.check_prompt(ids)
    max_tokens = serving.max_tokens(req.max_tokens, max(len(p) for p in prompts), "max_tokens")
    params = serving.sampling_params(req, max_tokens, req.logprobs)
    rid = serving.new_id("cmpl")
    sub = serving.submit(rid, prompts, params, req.cache_salt)
    num_prompt = sum(len(p) for p in prompts)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStream(_stream(serving, sub, rid, model, req.n, len(prompts), num_prompt, usage), sub)
    try:
        choices, cached = await serving.until_disconnect(raw, collect(sub, len(prompts) * req.n, req.n))
    finally:
        sub.close()
    completion = sum(c.num_tokens for c in choices)
    resp = CompletionResponse(
        id=rid, model=model,
        choices=[CompletionChoice(index=c.index, text=c.text, logprobs=_logprobs(serving, c.logprobs, 0),
                                  finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in choices],
        usage=Usage.of(num_prompt, completion, cached))
    return Response(resp.model_dump_json(), media_type="application/json")


async def _stream(serving: Serving, sub: Submission, rid: str, model: str, n: int, num_prompts: int,
                  num_prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())
    # each choice's text offset of its next token, for logprobs: from the token strings, as in a whole
    # reply (the text sent so far lags behind where a tail that may begin a stop string is held back)
    chars = [0] * (num_prompts * n)

    def render(c: ChoiceText) -> str | None:
        if not c.text and c.logprobs is None and c.finish_reason is None:
            return None  # tokens whose text is still held back: nothing to show yet
        logprobs = _logprobs(serving, c.logprobs, chars[c.index])
        if logprobs is not None:
            chars[c.index] += sum(len(t) for t in logprobs.tokens)
        choice = CompletionChoice(index=c.index, text=c.text, logprobs=logprobs,
                                  finish_reason=c.finish_reason, stop_reason=c.stop_reason)
        return sse(CompletionResponse(id=rid, created=created, model=model, choices=[choice]))

    def usage_event(completion: int, cached: int) -> str:
        return sse(CompletionResponse(id=rid, created=created, model=model, choices=[],
                                      usage=Usage.of(num_prompt_tokens, completion, cached)))

    async for event in stream_events(sub, n, render, usage_event if include_usage else None):
        yield event
