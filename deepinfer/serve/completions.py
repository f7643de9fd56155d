"""``POST /v1/completions``: prompts in, text completions out, whole or streamed."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.serve.outputs import ChoiceText, EventStream, collect, sse, stream_events
from deepinfer.serve.protocol import (
    APIError,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from deepinfer.serve.serving import Serving, Submission


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a request's choices hold beyond the engine's output: choice i * n + j is sample j of
    prompt i; with echo it starts with the prompt's text (and its logprobs, with logprobs)."""

    n: int
    prompt_ids: list[list[int]]
    echo_texts: list[str] | None  # per prompt; None: no echo
    echo_only: bool  # max_tokens 0 with echo: the prompt alone
    logprobs: int | None
    prompt_logprobs: int | None


async def _prompts(serving: Serving, req: CompletionRequest) -> tuple[list[list[int]], list[str | None]]:
    """Each prompt's token ids, and its text where it came as text."""
    p = req.prompt
    if isinstance(p, str):
        return [await serving.encode(p, True)], [p]
    if all(isinstance(x, int) for x in p):
        serving.check_token_ids(len(p))
        return [list(p)], [None]
    if all(isinstance(x, str) for x in p):
        return await serving.encode_many(list(p), True), list(p)
    for x in p:
        serving.check_token_ids(len(x))
    return [list(x) for x in p], [None] * len(p)


def _num_prompts(req: CompletionRequest) -> int:
    p = req.prompt
    return 1 if isinstance(p, str) or all(isinstance(x, int) for x in p) else len(p)


def _echo_texts(serving: Serving, prompts: list[list[int]], texts: list[str | None]) -> list[str]:
    """The text each choice echoes: the prompt as sent, or its token ids decoded (as vLLM)."""
    if serving.tokenizer is None:
        raise APIError(400, "echo needs the model's tokenizer to decode the prompt, and this model has no "
                       "tokenizer.json", param="echo")
    return [t if t is not None else serving.tokenizer.decode(ids, False) for ids, t in zip(prompts, texts, strict=True)]


def _logprobs(serving: Serving, entries: list[TokenLogprobs | None], offset: int, k: int,
              first_token: int) -> CompletionLogprobs:
    """OpenAI's legacy format; ``top_logprobs`` holds the token itself and the k most likely. A None
    entry is an echoed prompt's first token (``first_token``), which nothing precedes: no logprobs."""
    out = CompletionLogprobs()
    for e in entries:
        if e is None:
            token, lp, top = first_token, None, None
        else:
            token, lp = next(iter(e.items()))
            top = {serving.token_str(token): lp}
            # distinct ids may share a string (partial UTF-8): the token itself, then the likelier, keeps it
            for t, v in serving.top(e, k):
                top.setdefault(serving.token_str(t), v)
        s = serving.token_str(token)
        out.tokens.append(s)
        out.token_logprobs.append(lp)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(s)
    return out


def _choice(serving: Serving, shape: _Shape, sub: Submission, c: ChoiceText, offset: int,
            first: bool) -> CompletionChoice:
    """Choice ``c`` (all of it, or one streamed part: the ``first`` one echoes the prompt)."""
    p = c.index // shape.n
    text, entries = c.text, c.logprobs
    finish, stop = c.finish_reason, c.stop_reason
    if shape.echo_only:  # (the engine's one token is dropped, and with it why it ended)
        text, entries = "", None if entries is None else []
        finish, stop = None if finish is None else "length", None
    if first and shape.echo_texts is not None:
        text = shape.echo_texts[p] + text
        if shape.logprobs is not None:
            entries = [*sub.prompt_logprobs_of(p), *(entries or [])]
    prompt_logprobs = None
    if shape.prompt_logprobs is not None and first:
        prompt_logprobs = serving.prompt_logprobs(sub.prompt_logprobs_of(p), shape.prompt_logprobs)
    logprobs = None
    if entries is not None and shape.logprobs is not None:
        logprobs = _logprobs(serving, entries, offset, shape.logprobs, shape.prompt_ids[p][0])
    return CompletionChoice(index=c.index, text=text, logprobs=logprobs, finish_reason=finish,
                            stop_reason=stop, prompt_logprobs=prompt_logprobs)


async def create_completion(serving: Serving, req: CompletionRequest, raw: Request) -> Response:
    model = serving.check_model(req.model)
    serving.check_supported(req)
    echo_only = req.echo and req.max_tokens == 0
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "max_tokens: 0 is only valid with echo: true (which returns the prompt alone); "
                       "give at least 1", param="max_tokens")
    if echo_only and req.min_tokens:
        raise APIError(400, "min_tokens: must be 0 with max_tokens 0", param="min_tokens")
    serving.check_n(req.n, _num_prompts(req))
    prompts, texts = await _prompts(serving, req)
    for ids in prompts:
        serving.check_prompt(ids)
    echo_texts = _echo_texts(serving, prompts, texts) if req.echo else None
    max_tokens = serving.max_tokens(req.max_tokens, max(len(p) for p in prompts), "max_tokens")
    serving.check_response_size(len(prompts) * req.n, max(max_tokens, 1), req.logprobs, req.stream, "max_tokens")
    # echoed logprobs need the prompt's; the engine computes the larger count once for both uses
    wanted = [k for k in (req.prompt_logprobs, req.logprobs if req.echo else None) if k is not None]
    params = serving.sampling_params(req, max(max_tokens, 1), req.logprobs, max(wanted) if wanted else None)
    shape = _Shape(req.n, prompts, echo_texts, echo_only, req.logprobs, req.prompt_logprobs)
    rid = serving.new_id("cmpl")
    sub = serving.submit(rid, prompts, params, req.cache_salt)
    num_prompt = sum(len(p) for p in prompts)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStream(_stream(serving, sub, rid, model, shape, num_prompt, usage), sub)
    try:
        choices, cached = await serving.until_disconnect(raw, collect(sub, len(prompts) * req.n, req.n))
    finally:
        sub.close()
    completion = 0 if echo_only else sum(c.num_tokens for c in choices)
    resp = CompletionResponse(id=rid, model=model, choices=[_choice(serving, shape, sub, c, 0, True) for c in choices],
                              usage=Usage.of(num_prompt, completion, cached))
    return Response(resp.model_dump_json(), media_type="application/json")


async def _stream(serving: Serving, sub: Submission, rid: str, model: str, shape: _Shape, num_prompt_tokens: int,
                  include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())
    num_choices = len(shape.prompt_ids) * shape.n
    # each choice's text offset of its next token, for logprobs: from the token strings, as in a whole
    # reply (the text sent so far lags behind where a tail that may begin a stop string is held back)
    chars = [0] * num_choices
    echoed = [shape.echo_texts is None] * num_choices

    def render(c: ChoiceText) -> str | None:
        first = not echoed[c.index]
        if not first and c.finish_reason is None and (shape.echo_only or (not c.text and c.logprobs is None)):
            return None  # tokens whose text is still held back (or not shown): nothing to show yet
        echoed[c.index] = True
        choice = _choice(serving, shape, sub, c, chars[c.index], first)
        if choice.logprobs is not None:
            chars[c.index] += sum(len(t) for t in choice.logprobs.tokens)
        return sse(CompletionResponse(id=rid, created=created, model=model, choices=[choice]))

    def usage_event(completion: int, cached: int) -> str:
        return sse(CompletionResponse(id=rid, created=created, model=model, choices=[],
                                      usage=Usage.of(num_prompt_tokens, 0 if shape.echo_only else completion,
                                                     cached)))

    async for event in stream_events(sub, shape.n, render, usage_event if include_usage else None):
        yield event
