"""The engine loop: add requests, step (schedule, run, sample, stop checks), abort."""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from deepinfer.core.context import EngineContext
from deepinfer.core.gauges import EngineGauges
from deepinfer.core.interfaces import Drafter, Scheduler
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.model_runner import ModelRunner, StepInFlight
from deepinfer.core.request import Request, RequestOutput
from deepinfer.core.request_table import RequestTable, Touched
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.speculation import Speculation, plans_ahead
from deepinfer.core.tokenizer import Tokenizer


class _NoHooks:
    """Stands in for the hook relay when no observer is registered."""

    def __getattr__(self, name: str):
        return lambda **kwargs: None


class LLMEngine:
    """Owns the request table and runs steps; every concrete part arrives as a plugin instance."""

    def __init__(self, ctx: EngineContext, runner: ModelRunner, scheduler: Scheduler,
                 kv: KVCacheManager, tokenizer: Tokenizer | None, max_model_len: int,
                 eos_token_ids: Sequence[int] = (), drafter: Drafter | None = None,
                 hooks: Any = None) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.metrics = ctx.metrics
        self.runner = runner
        self.scheduler = scheduler
        self.kv = kv
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.drafter = drafter
        self.hooks = hooks if hooks is not None else _NoHooks()
        self.table = RequestTable(scheduler, kv, self.metrics, self.hooks, tokenizer, self.eos_token_ids,
                                  max_model_len, ctx.model_config.get("vocab_size"), self._release)
        self.requests = self.table.requests  # user request id -> RequestState
        self.plugin_names: dict[str, list[str]] = {}  # slot -> plugin names, filled by the builder
        #: report requests after every step (streaming); off, step() returns finished ones only,
        #: sparing a copy of every running request's tokens per step
        self.emit_unfinished = True
        #: plan step N+1 while step N runs (``plans_ahead`` says when; tests set it to exercise the
        #: overlapped path on the CPU)
        self.overlap = plans_ahead(scheduler, drafter, ctx.device)
        self.in_flight: StepInFlight | None = None  # the step left running on the device
        #: with a drafter, propose the next step's drafts as soon as a step's tokens are taken, before
        #: its text and outputs are made, so that the drafts' device work runs meanwhile; only where
        #: the device runs queued work asynchronously (tests and benchmarks set it to compare)
        self.early_propose = ctx.device is None or ctx.device.asynchronous
        if drafter is not None and self.early_propose:  # (a drafter may queue its next round early)
            runner.on_verified = drafter.on_verified
        self.gauges = EngineGauges(self.metrics, kv, scheduler, getattr(runner, "model", None))
        self.spec = Speculation(drafter, scheduler, self.metrics) if drafter is not None else None

    # ---------------------------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, cache_salt: str | None = None) -> None:
        """Check a request (ValueError, PromptTooLongError: what is wrong) and queue it."""
        self.table.add(request_id, prompt_token_ids, params, prompt, cache_salt)
        if self.spec is not None:
            self.spec.joined()

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; False if it is not (or no longer) running."""
        return self.table.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def shutdown(self) -> None:
        """Abort what is still running (freeing its blocks), stop the runner's other ranks (tensor
        parallelism) and tell the hook plugins."""
        for rid in list(self.requests):
            self.abort_request(rid)
        self.runner.close()
        self.hooks.deepinfer_engine_stopped(engine=self)

    # -------------------------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Schedule, execute, update; return the requests that changed (or finished, see
        ``emit_unfinished``).

        With overlap, a launched step is left running on the device (``in_flight``) while the next
        is planned and launched; it is taken in the next call. Steps that need host-side state
        (drafts, logprobs, penalties) are taken at once; with a drafter (``early_propose``), the
        next step's drafts are then proposed before this step's text and outputs are made, so that
        the draft's device work runs meanwhile.
        """
        self.hooks.deepinfer_step_begin(engine=self)
        touched: Touched = {}
        if self.spec is not None:  # (a drafter that needs every token takes the step in flight first)
            self.spec.begin_step(self.table.decoding, partial(self._take, touched) if self.in_flight else None)
        sched = self.scheduler.schedule()                                   # schedule
        self.table.preempted(sched.preempted)
        if self.spec is not None:
            sched = self.spec.with_drafts(sched)
        flight = self.runner.launch(sched) if not sched.empty else None     # execute
        if self.in_flight is not None:                                      # update: the step before
            self._take(touched)
        if flight is not None and self.overlap and not flight.must_sync:
            self._leave_running(flight)
        elif flight is not None:                                            # update: this step
            self._update(flight, touched)
        self.hooks.deepinfer_step_end(engine=self, num_tokens=sched.num_tokens)
        if self.spec is not None and self.early_propose and flight is not None and self.in_flight is None:
            self.spec.propose_early(self.table.decoding)  # (the next step's drafts, before the outputs)
        outputs = self.table.emit(touched, self.emit_unfinished)
        self.gauges.update()
        return outputs

    def _leave_running(self, flight: StepInFlight) -> None:
        """A step left running: its requests advance now, and those that sample hold a pending token."""
        flight.left_running = True
        live = self.table.live(flight.sched)
        self.table.account(live, flight.result)
        self.table.advance(live, flight.result.num_rejected)
        self.table.hold_pending(flight.sampling)
        self.in_flight = flight

    def _update(self, flight: StepInFlight, touched: Touched) -> None:
        """Wait for a step and apply its results: tokens appended up to a stop, requests advanced
        (a step left running advanced them at launch), finished ones released."""
        result = self.runner.collect(flight)
        if flight.left_running:
            self.table.finish(self.table.deliver(self.table.owned(flight.sampling), result, touched))
            return
        live = self.table.live(flight.sched)
        self.table.account(live, result)
        if self.spec is not None:
            self.spec.observe(live, result)
        finished = self.table.deliver([s.request for s in live.scheduled], result, touched)
        self.table.advance(live, result.num_rejected)  # (after the tokens: accepted drafts count)
        self.table.finish(finished)

    def _take(self, touched: Touched) -> None:
        """Wait for the step left running and apply its results."""
        flight, self.in_flight = self.in_flight, None
        self._update(flight, touched)

    def _release(self, req: Request) -> None:
        """The request finished or was preempted: its draft goes (and the drafter's state for it)."""
        if self.spec is not None:
            self.spec.release(req)
        else:
            req.draft = None

    def get_metrics(self) -> dict[str, float]:
        self.gauges.update(with_experts=True)
        return self.metrics.snapshot()
