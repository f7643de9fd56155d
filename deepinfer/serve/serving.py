"""What completions and chat share: model check, limits, SamplingParams, submission, disconnects."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.serve.engine_client import EngineClient, EngineDeadError, RequestFailed
from deepinfer.serve.engine_core import RequestDelta
from deepinfer.serve.metrics import RequestTimer, ServerMetrics
from deepinfer.serve.protocol import APIError, SamplingFields, valid_range
from deepinfer.serve.structured import structured_outputs

T = TypeVar("T")
# long prompts are tokenized off the event loop so other streams keep flowing meanwhile
_TOKENIZE_INLINE_CHARS = 16_384
#: the default character bound of a prompt (or a chat's messages), per token of max_model_len: a
#: text longer than this cannot fit the context whatever the tokenizer (a token of a real
#: vocabulary averages 3 to 5 characters), so it is refused before it is tokenized
CHARS_PER_TOKEN = 16


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what one request may ask of the server (``deepinfer serve`` flags; docs/serve.md).

    ``max_prompt_chars`` and ``max_prompt_token_ids`` default (None) to ``CHARS_PER_TOKEN`` x and 1 x
    max_model_len."""

    max_n: int = 32
    #: a non-streamed reply is built whole in memory: prompts x n x max_tokens x (1 + logprobs per
    #: token) may not pass this (a streamed one is sent as it comes and is not bounded here)
    max_response_tokens: int = 262_144
    max_prompt_chars: int | None = None
    max_chat_messages: int = 2048
    max_prompt_token_ids: int | None = None


class ClientDisconnected(Exception):
    """The client closed the connection before its response was ready."""


def validation_message(e: ValidationError, model: type[BaseModel] | None = None) -> tuple[str, str | None]:
    """A one-line message and the offending parameter from a pydantic error (with the field's valid
    range, from ``model``, when a bound was passed)."""
    err = e.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid value")
    if (model is not None and len(loc) == 1 and err.get("type", "").startswith(("greater_than", "less_than"))
            and (bounds := valid_range(model, loc[0])) is not None):
        msg += f" (valid: {bounds})"
    return (f"{param}: {msg}" if param else msg), param


@dataclass(slots=True, eq=False)
class Submission:
    """One API request in the engine: one engine request per prompt, all feeding one queue."""

    serving: Serving
    num_seqs: int
    timers: list[RequestTimer]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    pending: set[str] = field(default_factory=set)
    index: dict[str, int] = field(default_factory=dict)
    # per prompt, once the engine has sent them (only if the SamplingParams asked for them)
    prompt_logprobs: list[list[TokenLogprobs | None] | None] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.pending

    async def next_batch(self) -> list[tuple[int, RequestDelta]]:
        """Wait for news, then take everything queued: a slow reader gets fewer, larger chunks."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        out = []
        for item in items:
            if isinstance(item, RequestFailed):
                self.pending.discard(item.request_id)
                kind = "invalid_request_error" if item.status < 500 else "server_error"
                raise APIError(item.status, item.message, type=kind)
            i = self.index[item.request_id]
            if item.prompt_logprobs is not None:
                self.prompt_logprobs[i] = item.prompt_logprobs
            timer = self.timers[i]
            timer.tokens(max((len(s.token_ids) for s in item.seqs), default=0))  # positions, not n x
            if item.finished:
                self.pending.discard(item.request_id)
                timer.finish()
            out.append((i, item))
        return out

    def prompt_logprobs_of(self, prompt: int) -> list[TokenLogprobs | None]:
        entries = self.prompt_logprobs[prompt]
        if entries is None:  # the engine sends them before any token of a request that asks for them
            raise RuntimeError(f"the engine sent no prompt logprobs for prompt {prompt}")
        return entries

    def close(self) -> None:
        """Abort whatever is still running (client gone, error, shutdown) and release the slots."""
        for rid in self.pending:
            self.serving.client.abort(rid)
        self.pending.clear()
        self.serving.in_flight_seqs -= self.num_seqs
        self.num_seqs = 0
        self.serving.submissions.discard(self)

    def fail(self, status: int, message: str) -> None:
        """Abort what is still running and end the response with this error (its stream with an
        error event and [DONE], a whole reply with the status)."""
        for rid in self.pending:
            self.serving.client.abort(rid)
            self.queue.put_nowait(RequestFailed(rid, status, message))


class Serving:
    """Shared request handling between the OpenAI routes and the engine client."""

    def __init__(self, client: EngineClient, tokenizer: Any, model_names: list[str], metrics: ServerMetrics,
                 max_in_flight_seqs: int, limits: RequestLimits | None = None) -> None:
        self.client = client
        self.limits = limits or RequestLimits()
        #: splits a chat choice's reasoning from its content (``--reasoning-parser``; None: off)
        self.reasoning_parser: Any = None
        #: reads tool calls from chat replies in the model's format (``--tool-call-parser``; None: off)
        self.tool_parser: Any = None
        self.tokenizer = tokenizer
        self.model_names = model_names
        self.metrics = metrics
        self.max_model_len: int = client.info["max_model_len"]
        self.max_prompt_chars = self.limits.max_prompt_chars or CHARS_PER_TOKEN * self.max_model_len
        self.max_prompt_token_ids = self.limits.max_prompt_token_ids or self.max_model_len
        #: every request being answered (shutdown fails what outlasts the grace period)
        self.submissions: set[Submission] = set()
        self.vocab_size: int | None = client.info.get("vocab_size")
        self.max_in_flight_seqs = max_in_flight_seqs
        self.in_flight_seqs = 0
        self.draining = False
        self.prefill_only = False  # deepinfer serve --role prefill: every request answers one token
        self._token_str: dict[int, str] = {}
        self.template_roles: dict[str, bool] = {}  # whether the chat template renders each role

    # ------------------------------------------------------------------------------ validation
    def check_model(self, name: str) -> str:
        if name not in self.model_names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{self.model_names[0]!r} (see GET /v1/models)", param="model", code="model_not_found")
        return self.model_names[0]

    def check_supported(self, req: SamplingFields) -> None:
        what = req.unsupported()
        if what is not None:
            raise APIError(400, f"{what} is not supported by this server", param=what, code="unsupported")
        if req.prompt_logprobs is not None and req.stream:  # (vLLM refuses it too, from 1 up)
            raise APIError(400, "prompt_logprobs is not available with stream: true; ask for it without stream",
                           param="prompt_logprobs")

    def require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer.json: send prompts as token ids", param="prompt")
        return self.tokenizer

    def check_n(self, n: int, num_prompts: int = 1) -> None:
        """Refuse an n above ``--max-n``, and more sequences than the server ever takes at once,
        before any prompt is tokenized."""
        if n > self.limits.max_n:
            raise APIError(400, f"n is {n}, but this server allows at most {self.limits.max_n} (--max-n)",
                           param="n", code="limit_exceeded")
        if n * num_prompts > self.max_in_flight_seqs:
            raise self._too_many_seqs(n, num_prompts)

    def _too_many_seqs(self, n: int, num_prompts: int) -> APIError:
        return APIError(400, f"the request has {n * num_prompts} sequences (n = {n} for each of {num_prompts} "
                        f"prompts); this server takes at most {self.max_in_flight_seqs} at once (max_num_seqs "
                        "+ max_waiting_requests): send fewer prompts or a smaller n", param="n")

    def check_text_length(self, chars: int, param: str) -> None:
        """Refuse a text that cannot fit the context, before tokenizing it (``--max-prompt-chars``)."""
        if chars > self.max_prompt_chars:
            raise APIError(400, f"{param} has {chars} characters; this server tokenizes at most "
                           f"{self.max_prompt_chars} (--max-prompt-chars, by default {CHARS_PER_TOKEN} per token "
                           f"of the {self.max_model_len}-token context): a longer text cannot fit; shorten it",
                           param=param, code="context_length_exceeded")

    def check_token_ids(self, count: int, param: str = "prompt") -> None:
        if count > self.max_prompt_token_ids:
            raise APIError(400, f"{param} has {count} token ids; this server takes at most "
                           f"{self.max_prompt_token_ids} (--max-prompt-token-ids, by default max_model_len)",
                           param=param, code="context_length_exceeded")

    def check_response_size(self, num_seqs: int, max_tokens: int, logprobs: int | None, stream: bool,
                            param: str) -> None:
        """A non-streamed reply is built whole: bound prompts x n x max_tokens x (1 + logprobs)."""
        size = num_seqs * max_tokens * (1 + (logprobs or 0))
        if stream or size <= self.limits.max_response_tokens or (num_seqs == 1 and not logprobs):
            return  # (one sequence without logprobs is bounded by the context already)
        raise APIError(400, f"a non-streamed reply of {num_seqs} sequences x {param} {max_tokens} x (1 + "
                       f"{logprobs or 0} logprobs) = {size} tokens passes this server's limit of "
                       f"{self.limits.max_response_tokens} (--max-response-tokens); lower n, {param} or "
                       "logprobs, or stream the reply", param=param, code="limit_exceeded")

    async def encode(self, text: str, add_special_tokens: bool, param: str = "prompt") -> list[int]:
        return (await self.encode_many([text], add_special_tokens, param))[0]

    async def encode_many(self, texts: list[str], add_special_tokens: bool, param: str = "prompt") -> list[list[int]]:
        """Each text's token ids. Texts too long to fit are refused first; long ones are tokenized in
        a thread through the batch call, which releases the GIL (``Tokenizer.encode_many``)."""
        tok = self.require_tokenizer()
        for text in texts:
            self.check_text_length(len(text), param)
        if sum(len(t) for t in texts) > _TOKENIZE_INLINE_CHARS:
            return await asyncio.to_thread(tok.encode_many, texts, add_special_tokens)
        return [tok.encode(t, add_special_tokens) for t in texts]

    def check_prompt(self, ids: list[int], param: str = "prompt") -> None:
        if not ids:
            raise APIError(400, "the prompt is empty: give at least one token", param=param)
        if self.vocab_size is not None and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise APIError(400, f"prompt token ids must lie in [0, {self.vocab_size})", param=param)
        if len(ids) >= self.max_model_len:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens, but the "
                           f"prompt has {len(ids)} tokens and at least one must be generated; shorten the "
                           "prompt", param=param, code="context_length_exceeded")

    def max_tokens(self, requested: int | None, prompt_len: int, param: str) -> int:
        if self.prefill_only:  # a prefill instance: the prompt's KV and its first token
            requested = 1 if requested != 0 else 0
        room = self.max_model_len - prompt_len
        if requested is None:
            return room
        if requested > room:
            raise APIError(400, f"{param} is {requested}, but this model's maximum context length is "
                           f"{self.max_model_len} tokens and the prompt has {prompt_len}: at most {room} can "
                           "be generated; lower it", param=param, code="context_length_exceeded")
        return requested

    def sampling_params(self, req: SamplingFields, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        fields: dict[str, Any] = {"n": req.n, "max_tokens": max_tokens, "logprobs": logprobs,
                                  "prompt_logprobs": prompt_logprobs,
                                  "ignore_eos": req.ignore_eos, "min_tokens": req.min_tokens,
                                  "stop": req.stop, "skip_special_tokens": req.skip_special_tokens,
                                  "include_stop_str_in_output": req.include_stop_str_in_output,
                                  "seed": req.seed, "structured_outputs": structured_outputs(req),
                                  "kv_retention": req.kv_retention}
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "stop_token_ids"):
            value = getattr(req, name)
            if value is not None:
                fields[name] = value
        try:
            return SamplingParams(**fields)
        except ValidationError as e:
            msg, param = validation_message(e, SamplingParams)
            raise APIError(400, msg, param=param) from None

    # ------------------------------------------------------------------------------ submission
    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"

    def submit(self, request_id: str, prompts: list[list[int]], params: SamplingParams,
               cache_salt: str | None) -> Submission:
        """Admit the request (or 503) and send one engine request per prompt."""
        num_seqs = params.n * len(prompts)
        if self.draining:
            self.metrics.rejected.inc()
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down",
                           headers={"Retry-After": "5"})
        if num_seqs > self.max_in_flight_seqs:  # (never admitted, even on an idle server: not worth a retry)
            raise self._too_many_seqs(params.n, len(prompts))
        if self.in_flight_seqs + num_seqs > self.max_in_flight_seqs:
            self.metrics.rejected.inc()
            raise APIError(503, f"the server is at capacity ({self.in_flight_seqs} sequences in flight); retry "
                           "shortly", type="server_error", code="overloaded", headers={"Retry-After": "1"})
        rids = [f"{request_id}-{i}" for i in range(len(prompts))]
        sub = Submission(self, num_seqs, [RequestTimer(self.metrics) for _ in prompts],
                         prompt_logprobs=[None] * len(prompts))
        sub.pending.update(rids)
        sub.index.update((rid, i) for i, rid in enumerate(rids))
        self.in_flight_seqs += num_seqs
        self.submissions.add(sub)
        try:
            for rid, ids in zip(rids, prompts, strict=True):
                self.client.add(rid, ids, params, cache_salt, sub.queue)
        except EngineDeadError as e:
            sub.close()
            raise APIError(503, f"the engine is not running: {e}", type="server_error") from None
        return sub

    def expire(self, grace_period: float) -> int:
        """The grace period is over: fail every request still being answered with a 503 (streams
        end with an error event and [DONE]); how many there were."""
        subs = [sub for sub in self.submissions if sub.pending]
        for sub in subs:
            sub.fail(503, f"the server is shutting down and this request did not finish within its "
                     f"{grace_period:g} s grace period; it was aborted, retry it elsewhere")
        return len(subs)

    async def until_disconnect(self, request: Request, work: Awaitable[T]) -> T:
        """Run ``work`` unless the client hangs up first (then raise ClientDisconnected)."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled from outside (shutdown): take the work down with us
            task.cancel()
            raise
        finally:
            watcher.cancel()
        if task.done():
            return task.result()
        task.cancel()
        self.metrics.client_aborts.inc()
        raise ClientDisconnected()

    # ------------------------------------------------------------------------------- logprobs
    def token_str(self, token_id: int) -> str:
        s = self._token_str.get(token_id)
        if s is None:
            s = self.tokenizer.decode([token_id], False) if self.tokenizer is not None else f"<{token_id}>"
            self._token_str[token_id] = s
        return s

    @staticmethod
    def top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
        """The k most likely tokens of one position (the engine puts the sampled one first)."""
        return sorted(entry.items(), key=lambda kv: -kv[1])[:k] if k else []

    def prompt_logprobs(self, entries: list[TokenLogprobs | None], k: int) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a dict by token
        id of the token itself and the k likeliest, each with its rank in the vocabulary (the
        engine's ``TokenLogprobs``)."""
        out: list[dict[str, Any] | None] = []
        for e in entries:
            if e is None:
                out.append(None)
                continue
            token, lp = next(iter(e.items()))
            row = {str(token): self._prompt_logprob(token, lp, e.rank_of(token))}
            for t, v in self.top(e, k):
                row.setdefault(str(t), self._prompt_logprob(t, v, e.rank_of(t)))
            out.append(row)
        return out

    def _prompt_logprob(self, token: int, logprob: float, rank: int | None) -> dict[str, Any]:
        # -inf has no JSON form: vLLM sends -9999.0 in its place
        return {"logprob": max(logprob, -9999.0), "rank": rank, "decoded_token": self.token_str(token)}


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
