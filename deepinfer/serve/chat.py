"""``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.sampling_params import SamplingParams, StructuredOutputsParams
from deepinfer.serve.outputs import ChoiceText, EventStream, collect, sse, stream_events
from deepinfer.serve.protocol import (
    APIError,
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
from deepinfer.serve.replies import ReplyStream, whole_message
from deepinfer.serve.serving import Serving, Submission
from deepinfer.serve.tools import tool_choice, tool_grammar


async def _render(serving: Serving, req: ChatCompletionRequest) -> list[int]:
    tok = serving.require_tokenizer()
    limit = serving.limits.max_chat_messages
    if len(req.messages) > limit:
        raise APIError(400, f"messages has {len(req.messages)} entries; this server takes at most {limit} "
                       "(--max-chat-messages)", param="messages", code="limit_exceeded")
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {}),
                 **({"tool_calls": m.tool_calls} if m.tool_calls else {}),
                 **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})} for m in req.messages]
    tools = {"tools": req.tools} if req.tools else {}
    # (before rendering: the template's text is longer still)
    serving.check_text_length(sum(len(m["content"]) + len(m.get("name", "")) for m in messages), "messages")
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt, **tools)
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
    tool_parser, params = _tools(serving, req, params)
    rid = serving.new_id("chatcmpl")
    sub = serving.submit(rid, [ids], params, req.cache_salt)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStream(_stream(serving, sub, rid, model, req.n, k, len(ids), usage, tool_parser), sub)
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
        choices=[_choice(serving, tool_parser, c, k) for c in choices],
        usage=Usage.of(len(ids), completion, cached), prompt_logprobs=prompt_logprobs)
    return Response(resp.model_dump_json(), media_type="application/json")


def _choice(serving: Serving, tool_parser: Any, c: ChoiceText, k: int) -> ChatChoice:
    """A whole choice: its reasoning, content and tool calls parted (a reply that calls ends with
    ``tool_calls``, as OpenAI's)."""
    message = whole_message(serving.reasoning_parser, tool_parser, c.text)
    finish = "tool_calls" if message.tool_calls and c.finish_reason == "stop" else c.finish_reason
    return ChatChoice(index=c.index, message=message, logprobs=_logprobs(serving, c.logprobs, k),
                      finish_reason=finish, stop_reason=c.stop_reason)


def _tools(serving: Serving, req: ChatCompletionRequest, params: SamplingParams) -> tuple[Any, SamplingParams]:
    """The tool parser that reads this request's replies (None: no calls to parse) and its sampling
    parameters with the grammar that enforces tool_choice required or a named function."""
    mode, _ = tool_choice(req)
    if not req.tools or mode == "none":
        return None, params
    parser = serving.tool_parser
    if parser is None:
        raise APIError(400, "tools need a tool-call parser: start the server with --tool-call-parser (hermes, "
                       "deepseek_v3, ...) for this model's format", param="tools", code="unsupported")
    grammar = tool_grammar(parser, req)
    if grammar is not None:
        if params.structured_outputs is not None:
            raise APIError(400, f"tool_choice {mode!r} constrains the reply itself: it cannot be combined with "
                           "response_format or guided_*", param="tool_choice")
        params = params.model_copy(update={"structured_outputs": StructuredOutputsParams(grammar=grammar)})
    return parser, params


async def _stream(serving: Serving, sub: Submission, rid: str, model: str, n: int, k: int, num_prompt_tokens: int,
                  include_usage: bool, tool_parser: Any) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choices: list[ChatChunkChoice]) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices))

    # OpenAI opens every choice with the role before any content
    yield "".join(chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))])
                  for i in range(n))

    parts = serving.reasoning_parser is not None or tool_parser is not None
    replies: dict[int, ReplyStream] = {}

    def render(c: ChoiceText) -> str | None:
        finish = c.finish_reason
        if parts:
            reply = replies.setdefault(c.index, ReplyStream(serving.reasoning_parser, tool_parser))
            delta = reply.feed(c.text, finish is not None)
            if reply.called and finish == "stop":
                finish = "tool_calls"
        else:
            delta = DeltaMessage(content=c.text) if c.text else None
        if delta is None and c.logprobs is None and finish is None:
            return None  # tokens whose text is still held back: nothing to show yet
        if delta is None:
            delta = DeltaMessage(content="") if c.logprobs is not None else DeltaMessage()
        return chunk([ChatChunkChoice(index=c.index, delta=delta, logprobs=_logprobs(serving, c.logprobs, k),
                                      finish_reason=finish, stop_reason=c.stop_reason)])

    def usage_event(completion: int, cached: int) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=[],
                                       usage=Usage.of(num_prompt_tokens, completion, cached)))

    async for event in stream_events(sub, n, render, usage_event if include_usage else None):
        yield event
