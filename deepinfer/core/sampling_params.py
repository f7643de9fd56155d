"""Sampling parameters of one request, validated by pydantic."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StructuredOutputsParams(BaseModel):
    """One constraint on a request's output, compiled to a grammar (vLLM's fields): a JSON schema,
    any JSON object, a regular expression, one of a list of strings, or an EBNF grammar."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: a JSON schema (a dict, or its JSON text); the output is an instance of it
    json_schema: dict[str, Any] | str | None = None
    #: the output is some JSON object
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    #: a grammar in xgrammar's EBNF (GBNF-like; its start rule is ``root``)
    grammar: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsParams:
        given = [k for k in ("json_schema", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("structured_outputs takes exactly one of json_schema, json_object, regex, choice, "
                             f"grammar; got {', '.join(given) or 'none'}")
        return self

    @property
    def kind(self) -> str:
        """Which constraint it is: ``json_schema``, ``json_object``, ``regex``, ``choice`` or ``grammar``."""
        if self.json_object:
            return "json_object"
        return next(k for k in ("json_schema", "regex", "choice", "grammar") if getattr(self, k) is not None)


class SamplingParams(BaseModel):
    """How one request is decoded: vLLM's fields and defaults."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables top-k")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    # (bounded away from 0: a positive logit divided by 1e-40 overflows float32 to infinity)
    repetition_penalty: float = Field(1.0, ge=0.01, le=10.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    max_tokens: int | None = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    skip_special_tokens: bool = True
    #: constrain the output to a grammar (xgrammar): the sampler masks every token the grammar
    #: forbids, and the request ends once the grammar is complete
    structured_outputs: StructuredOutputsParams | None = None
    #: retention class of the request's KV in a store that keeps it (the `kv-store` policy's
    #: ``retention`` names them: "agent", "chat" by default); None: that policy's default
    kv_retention: str | None = Field(None, min_length=1, max_length=64)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, v: object) -> object:
        if v is None:
            return []
        if isinstance(v, str):
            return [v]
        return v

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("stop strings must not be empty")
        return v

    @model_validator(mode="after")
    def _min_le_max(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def effective_top_k(self) -> int:
        return max(0, self.top_k)

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
