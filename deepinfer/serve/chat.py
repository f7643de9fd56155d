"""``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.serve.outputs import ChoiceText, EventStream, collect, sse, stream_events
from deepinfer.serve.protocol import (
    APIError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from deepinfer.serve.serving import Serving, Submission


async def _render(serving: Serving, req: ChatCompletionRequest) -> list[int]:
    tok = serving.require_tokenizer()
    limit = serving.limits.max_chat_messages
    if len(req.messages) > limit:
        raise APIError(400, f"messages has {len(req.messages)} entries; this server takes at most {limit} "
                       "(--max-chat-messages)", param="messages", code="limit_exceeded")
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                for m in req.messages]
    # (before rendering: the template's text is longer still)
    serving.check_text_length(sum(len(m["content"]) + len(m.get("name", "")) for m in messages), "messages")
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - a template error is the caller's input failing the template
        # (a template that renders no role at all fails for some other reason: its own words then)
        if (roles := _unrenderable_roles(serving, {m["role"] for m in messages})) and (ok := _renderable(serving)):
            raise APIError(400, f"this model's chat template cannot render messages with the role "
                           f"{' or '.join(map(repr, roles))}; it renders {', '.join(map(repr, ok))}",
                           param="messages", code="unsupported_role") from None
        raise APIError(400, f"the chat template could not render these messages: {e}", param="messages") from None
    # the template already placed every special token it wants
    return await serving.encode(text, False, "messages")


_ROLES = ("system", "developer", "user", "assistant", "tool")


def _renders(serving: Serving, role: str) -> bool:
    """Whether the template renders a one-message chat of ``role`` (or one after a user message,
    for templates that insist on that first); remembered by the server."""
    tok, known = serving.tokenizer, serving.template_roles
    if role not in known:
        tries = [[{"role": role, "content": "x"}], [{"role": "user", "content": "x"}, {"role": role, "content": "x"}]]
        known[role] = any(_renders_messages(tok, messages) for messages in tries)
    return known[role]


def _renders_messages(tok, messages: list[dict[str, str]]) -> bool:
    try:
        tok.apply_chat_template(messages, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - the template refused them
        return False
    return True


def _unrenderable_roles(serving: Serving, roles: set[str]) -> list[str]:
    return [r for r in _ROLES if r in roles and not _renders(serving, r)]


def _renderable(serving: Serving) -> list[str]:
    return [r for r in _ROLES if _renders(serving, r)]


def _logprobs(serving: Serving, entries: list[TokenLogprobs] | None, k: int) -> ChatLogprobs | None:
    if entries is None:
        return None
    content = []
    for e in entries:
        token, lp = next(iter(e.items()))
        s = serving.token_str(token)
        tops = []
        for t, v in serving.top(e, k):
            ts = serving.token_str(t)
            tops.append(TopLogprob(token=ts, logprob=v, bytes=list(ts.encode())))
        content.append(TokenLogprob(token=s, logprob=lp, bytes=list(s.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)


async def create_chat_completion(serving: Serving, req: ChatCompletionRequest, raw: Request) -> Response:
    model = serving.check_model(req.model)
    serving.check_supported(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    serving.check_n(req.n)
    ids = await _render(serving, req)
    serving.check_prompt(ids, "messages")
    if req.max_completion_tokens is not None:
        param, max_tokens = "max_completion_tokens", serving.max_tokens(req.max_completion_tokens, len(ids),
                                                                        "max_completion_tokens")
    else:
        param, max_tokens = "max_tokens", serving.max_tokens(req.max_tokens, len(ids), "max_tokens")
    k = req.top_logprobs or 0
    serving.check_response_size(req.n, max_tokens, (k or 1) if req.logprobs else None, req.stream, param)
    params = serving.sampling_params(req, max_tokens, k if req.logprobs else None, req.prompt_logprobs)
    rid = serving.new_id("chatcmpl")
    sub = serving.submit(rid, [ids], params, req.cache_salt)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStream(_stream(serving, sub, rid, model, req.n, k, len(ids), usage), sub)
    try:
        choices, cached = await serving.until_disconnect(raw, collect(sub, req.n, req.n))
    finally:
        sub.close()
    completion = sum(c.num_tokens for c in choices)
    prompt_logprobs = None
    if req.prompt_logprobs is not None:
        prompt_logprobs = serving.prompt_logprobs(sub.prompt_logprobs_of(0), req.prompt_logprobs)
    resp = ChatCompletionResponse(
        id=rid, model=model,
        choices=[ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                            logprobs=_logprobs(serving, c.logprobs, k), finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason) for c in choices],
        usage=Usage.of(len(ids), completion, cached), prompt_logprobs=prompt_logprobs)
    return Response(resp.model_dump_json(), media_type="application/json")


async def _stream(serving: Serving, sub: Submission, rid: str, model: str, n: int, k: int, num_prompt_tokens: int,
                  include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choices: list[ChatChunkChoice]) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices))

    # OpenAI opens every choice with the role before any content
    yield "".join(chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))])
                  for i in range(n))

    def render(c: ChoiceText) -> str | None:
        if not c.text and c.logprobs is None and c.finish_reason is None:
            return None  # tokens whose text is still held back: nothing to show yet
        delta = DeltaMessage(content=c.text) if c.text or c.logprobs is not None else DeltaMessage()
        return chunk([ChatChunkChoice(index=c.index, delta=delta, logprobs=_logprobs(serving, c.logprobs, k),
                                      finish_reason=c.finish_reason, stop_reason=c.stop_reason)])

    def usage_event(completion: int, cached: int) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=[],
                                       usage=Usage.of(num_prompt_tokens, completion, cached)))

    async for event in stream_events(sub, n, render, usage_event if include_usage else None):
        yield event
