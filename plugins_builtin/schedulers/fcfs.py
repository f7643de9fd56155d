"""The `fcfs` scheduler: continuous batching in arrival order, chunked prefill, preemption by recompute."""
from __future__ import annotations

from collections import deque

from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Request, ScheduledRequest, Scheduler, SchedulerOutput


class FCFSOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    long_prefill_token_threshold: int = Field(
        0, ge=0, description="cap one request's prefill chunk per step (0: only the step budget caps it)")
    overlap: bool = Field(True, description="plan step N+1 while step N runs on the device (off: each step "
                                            "waits for the one before, for ablations)")


class FCFSScheduler(Scheduler):
    """Running requests first (decodes and unfinished prefills), then waiting ones in arrival order.

    Each step spends at most ``max_num_batched_tokens`` tokens over at most ``max_num_seqs``
    requests; a longer prompt is prefilled in chunks over several steps. When blocks run out, the
    newest running request is preempted (the core frees its blocks and resets it, to be computed
    again later with the tokens it had generated). It only chooses: the core updates the requests.
    """

    name = "fcfs"
    Options = FCFSOptions

    def __init__(self, options: FCFSOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.kv = ctx.kv
        self.max_tokens = ctx.config.max_num_batched_tokens
        self.max_seqs = ctx.config.max_num_seqs
        self.chunk_cap = options.long_prefill_token_threshold or self.max_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def overlap(self) -> bool:
        return self.options.overlap

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            i += 1
            if req.length_capped:  # ends with the token a running step is sampling
                continue
            # (tokens past num_tokens are drafts, which the core verifies)
            n = min(req.num_tokens - req.num_computed_tokens + req.num_draft_tokens, budget, self.chunk_cap)
            while not self.kv.allocate(req, n):
                victim = self.running.pop()  # the newest running request: the core resets it
                self.kv.preempt(victim)
                self.waiting.appendleft(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if preempted and preempted[-1] is req:
                break
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
        if not preempted:
            self._admit(scheduled, budget)
        return SchedulerOutput(tuple(scheduled), tuple(preempted))

    def _admit(self, scheduled: list[ScheduledRequest], budget: int) -> None:
        deferred: list[Request] = []  # waiting for a running request to finish a shared prefix
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            match = self.kv.match_prefix(req)
            if match.wait:
                deferred.append(self.waiting.popleft())
                continue
            todo = req.num_tokens - req.num_computed_tokens - match.num_tokens
            n = min(todo, budget, self.chunk_cap)
            if not self.kv.allocate(req, n, match):
                break
            self.running.append(self.waiting.popleft())
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
        self.waiting.extendleft(reversed(deferred))

    def remove_request(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
