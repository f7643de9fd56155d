"""From engine deltas to OpenAI choices: merging, collecting whole responses, and the event stream."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.responses import StreamingResponse

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.serve.engine_core import RequestDelta
from deepinfer.serve.protocol import APIError

if TYPE_CHECKING:
    from deepinfer.serve.serving import Submission


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    if hasattr(obj, "model_dump_json"):
        return f"data: {obj.model_dump_json(exclude_none=False)}\n\n"
    return f"data: {json.dumps(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


@dataclass(slots=True)
class ChoiceText:
    """One choice's text, tokens and logprobs, merged from consecutive deltas."""

    index: int
    parts: list[str] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, text: str, num_tokens: int, logprobs: list[TokenLogprobs] | None,
            finish_reason: str | None, stop_reason: int | str | None) -> None:
        if text:
            self.parts.append(text)
        self.num_tokens += num_tokens
        if logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(logprobs)
        if finish_reason is not None:
            self.finish_reason, self.stop_reason = finish_reason, stop_reason

    @property
    def text(self) -> str:
        return "".join(self.parts)


def merge_batch(batch: list[tuple[int, RequestDelta]], n: int) -> list[ChoiceText]:
    """Fold one batch of deltas into one ChoiceText per choice (choice = prompt index * n + seq index)."""
    merged: dict[int, ChoiceText] = {}
    for prompt_index, delta in batch:
        for s in delta.seqs:
            i = prompt_index * n + s.index
            c = merged.get(i)
            if c is None:
                c = merged[i] = ChoiceText(i)
            c.add(s.text, len(s.token_ids), s.logprobs, s.finish_reason, s.stop_reason)
    return list(merged.values())


async def collect(sub: Submission, num_choices: int, n: int) -> tuple[list[ChoiceText], int]:
    """Wait for every choice to finish; return them and the number of prompt tokens found cached."""
    choices = [ChoiceText(i) for i in range(num_choices)]
    cached = 0
    while not sub.done:
        batch = await sub.next_batch()
        for c in merge_batch(batch, n):
            choices[c.index].add(c.text, c.num_tokens, c.logprobs, c.finish_reason, c.stop_reason)
        cached += sum(d.num_cached_tokens for _, d in batch if d.finished)
    return choices, cached


async def stream_events(sub: Submission, n: int, render: Callable[[ChoiceText], str | None],
                        usage_event: Callable[[int, int], str] | None) -> AsyncIterator[str]:
    """The server-sent-event body shared by completions and chat: ``render`` turns each choice's
    delta into an event (None: nothing to show yet), one write per engine step; a failure becomes
    an error event; ``usage_event`` gets the completion token count and the prompt tokens found
    cached at the end; then [DONE]."""
    completion = cached = 0
    try:
        while not sub.done:
            parts = []
            batch = await sub.next_batch()
            cached += sum(d.num_cached_tokens for _, d in batch if d.finished)
            for c in merge_batch(batch, n):
                completion += c.num_tokens
                event = render(c)
                if event is not None:
                    parts.append(event)
            if parts:
                yield "".join(parts)
    except APIError as e:
        yield sse(e.body())
        yield SSE_DONE
        return
    if usage_event is not None:
        yield usage_event(completion, cached)
    yield SSE_DONE


class EventStream(StreamingResponse):
    """Server-sent events of one submission; whatever ends the response aborts what is still running."""

    def __init__(self, content: Any, sub: Submission) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.sub = sub

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.sub.pending:
                self.sub.serving.metrics.client_aborts.inc()
            self.sub.close()
