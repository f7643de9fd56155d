"""Request state inside the engine, and the outputs it reports."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    #: its logits could not be sampled (NaN or infinite): it ended alone, the others went on
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_ERROR,
        )


@dataclass(slots=True, eq=False)
class Request:
    """One sequence being generated: its tokens, progress through the model and its blocks."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    cache_salt: str | None = None
    max_model_len: int = 1 << 30
    arrival_time: float = field(default_factory=time.monotonic)
    all_token_ids: list[int] = field(default_factory=list)
    #: tokens being sampled by a step still on the device (overlap scheduling): they count in
    #: ``num_tokens`` (the next step computes them) and join ``all_token_ids`` when that step is taken
    num_pending: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens found in the cache at first schedule
    block_ids: list[int] = field(default_factory=list)
    #: sliding-window layers' block table when they keep a KV pool of their own (out-of-window
    #: entries hold the pool's null block)
    sliding_block_ids: list[int] = field(default_factory=list)
    #: full-attention KV is cached up to this position: computing tokens before it (a replay)
    #: writes only the sliding-window layers' KV
    replay_until: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    generator: torch.Generator | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    num_preemptions: int = 0
    first_token_time: float | None = None
    policy_state: dict[str, Any] = field(default_factory=dict)  # per cache-policy scratch
    draft: Any = None  # DraftProposal for the next step, set by the engine from the drafter
    #: its grammar's state (``core.grammar.GrammarState``) when its output is constrained
    #: (``params.structured_outputs``): advanced by each token it gains, read for each step's mask
    grammar: Any = None
    # From the parameters, once (they do not change after the request is added), for the checks
    # made of every sequence at every step (a pydantic field or property costs more to read):
    #: the length (prompt and output) from which its next token depends on the logits alone: never
    #: with penalties, after min_tokens output tokens otherwise (EOS held back until then). Only
    #: then may it decode speculatively or take the batch's plain argmax
    plain_from: int = field(init=False, default=0)
    greedy: bool = field(init=False, default=False)
    #: its sampling needs no host-side state that a step in flight could still change (no
    #: logprobs, no penalties, no grammar: its mask follows from the token before)
    overlappable: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        p = self.params
        self.plain_from = 1 << 62 if p.needs_penalties else len(self.prompt_token_ids) + p.min_tokens
        self.greedy = p.greedy
        self.overlappable = (p.logprobs is None and p.prompt_logprobs is None and not p.needs_penalties
                             and p.structured_outputs is None)
        if self.params.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Its tokens, the pending ones included."""
        return len(self.all_token_ids) + self.num_pending

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        """Its output tokens, the pending ones included."""
        return self.num_tokens - len(self.prompt_token_ids)

    @property
    def length_capped(self) -> bool:
        """Its tokens (pending ones included) reach max_tokens or the context: it ends with them."""
        p = self.params
        return ((p.max_tokens is not None and self.num_output_tokens >= p.max_tokens)
                or self.num_tokens >= self.max_model_len)

    @property
    def num_draft_tokens(self) -> int:
        """Drafts to verify in its next step: a scheduler may schedule up to this many tokens past
        ``num_tokens``, and the core verifies the ones it schedules."""
        return len(self.draft.verified) if self.draft is not None else 0

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence of a request, as the user sees it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The state of one user request (with its n sequences) after a step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
