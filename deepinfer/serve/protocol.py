"""Request and response schemas of the OpenAI API (completions, chat, models), and its error object."""
from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

# OpenAI's clients add fields over time; unknown ones are ignored, not fatal, but any field that
# changes what the caller gets back and that we do not implement is refused in `unsupported()`.
_REQUEST = ConfigDict(extra="ignore")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


class APIError(Exception):
    """An error meant for the client: its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param,
                                             code=self.code)).model_dump()


def valid_range(model: type[BaseModel], name: str) -> str | None:
    """The bounds of a numeric field, as an interval: ``[0.01, 10]``, ``(0, 1]``, ``>= 0``."""
    field = model.model_fields.get(name)
    if field is None:
        return None
    low = high = None
    for m in field.metadata:
        if isinstance(m, (Ge, Gt)):
            low = ("[" if isinstance(m, Ge) else "(", m.ge if isinstance(m, Ge) else m.gt)
        elif isinstance(m, (Le, Lt)):
            high = ("]" if isinstance(m, Le) else ")", m.le if isinstance(m, Le) else m.lt)
    if low and high:
        return f"{low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
    return None


def invalid_text(value: Any, path: str) -> str | None:
    """Where ``value`` holds a string that is not valid Unicode text (a lone surrogate, which JSON's
    ``\\ud800`` escape can carry), as ``path[3].content at character 5``; None: nowhere."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{path} at character {e.start}"
        return None
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            if (bad := invalid_text(getattr(value, name), f"{path}.{name}")) is not None:
                return bad
    elif isinstance(value, list) and value and not isinstance(value[0], int):
        for i, v in enumerate(value):
            if (bad := invalid_text(v, f"{path}[{i}]")) is not None:
                return bad
    elif isinstance(value, dict):
        for k, v in value.items():
            if (bad := invalid_text(k, f"{path or 'body'} key") or invalid_text(v, f"{path}.{k}")) is not None:
                return bad
    return None


class StreamOptions(BaseModel):
    model_config = _REQUEST

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampling fields shared by completions and chat (OpenAI's plus vLLM's extensions)."""

    model_config = _REQUEST

    model: str
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # every stop string is searched after every token: bounded so one request cannot stall the engine
    stop: str | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=16)] | None = \
        Field(None, max_length=256)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # (bounded away from 0: a logit divided by 1e-40 overflows to infinity; SamplingParams' bound)
    repetition_penalty: float | None = Field(None, ge=0.01, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    kv_retention: str | None = Field(None, min_length=1, max_length=64)  # a KV store's retention class
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's extension
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # structured outputs (deepinfer.serve.structured): OpenAI's response_format, vLLM's guided_*
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(None, max_length=65536)
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=4096)
    guided_grammar: str | None = Field(None, max_length=65536)

    @model_validator(mode="after")
    def _stream_options_with_stream(self) -> Any:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only with stream true")
        return self

    def unsupported(self) -> str | None:
        """Name a requested feature this server does not implement (refused, never ignored)."""
        if self.logit_bias:
            return "logit_bias"
        return None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: a prompt (text, texts, token ids or lists of them) to continue."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # 0: only with echo, which then returns the prompt alone
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("the prompt list is empty")
        return v

    def unsupported(self) -> str | None:
        if self.suffix:
            return "suffix"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        return super().unsupported()


class TextPart(BaseModel):
    model_config = _REQUEST

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _REQUEST

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, earlier in the chat
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    tool_choice: Any = None




# ------------------------------------------------------------------------------------- responses
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None = None) -> Usage:
        """Token counts of one response (``cached``: prompt tokens found in the prefix cache)."""
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=None if cached is None else {"cached_tokens": cached})


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One token of one prompt position in vLLM's ``prompt_logprobs`` (keyed by its token id)."""

    logprob: float
    rank: int | None = None  # in the vocabulary: 1 is the likeliest
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]


def _without(field: str) -> Any:
    """A serializer that leaves ``field`` out while it is None (asked-for extensions only)."""

    @model_serializer(mode="wrap")
    def serialize(self: BaseModel, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if out.get(field, 0) is None:
            del out[field]
        return out

    return serialize


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's extension, when asked for

    _serialize = _without("prompt_logprobs")


class CompletionResponse(BaseModel):
    """A completion, whole (``object: text_completion``) or one streamed chunk of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    #: the model's reasoning, apart from its answer, with --reasoning-parser (vLLM's and SGLang's field)
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # with tools: the calls parsed from the reply

    @model_serializer(mode="wrap")
    def _without_extensions(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for name in ("reasoning_content", "tool_calls"):
            if out.get(name, 0) is None:
                del out[name]
        return out


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    """A whole chat completion (``object: chat.completion``)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's extension, when asked for (one prompt: here)

    _serialize = _without("prompt_logprobs")


class DeltaMessage(BaseModel):
    """A chunk's delta: only the fields it carries (the role in the first, text after; a finish
    chunk's may be empty), as OpenAI's and vLLM's chunks leave the others out."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "deepinfer"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
