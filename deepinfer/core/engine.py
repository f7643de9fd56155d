"""The engine loop: add requests, step (schedule, run, sample, stop checks), abort."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from deepinfer.core.capabilities import SkipsRounds
from deepinfer.core.context import EngineContext
from deepinfer.core.interfaces import Drafter, Scheduler
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.model_runner import ModelRunner, StepInFlight
from deepinfer.core.request import Request, RequestOutput
from deepinfer.core.request_table import RequestTable, Touched
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.speculation import Speculation
from deepinfer.core.tokenizer import Tokenizer


class PromptTooLongError(ValueError):
    """A prompt does not fit the model's context."""


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
                                  max_model_len, self._release)
        self.requests = self.table.requests  # user request id -> RequestState
        self.plugin_names: dict[str, list[str]] = {}  # slot -> plugin names, filled by the builder
        #: report requests after every step (streaming); off, step() returns finished ones only,
        #: sparing a copy of every running request's tokens per step
        self.emit_unfinished = True
        #: plan step N+1 while step N runs: the scheduler's choice, on a device that runs queued
        #: work asynchronously, without a drafter (which needs every token on the host) or with
        #: one that says before each proposal whether it drafts (SkipsRounds); tests set
        #: it to exercise the overlapped path on the CPU
        device = ctx.device
        self.overlap = (scheduler.overlap
                        and (drafter is None or isinstance(drafter, SkipsRounds) and drafter.skips_rounds)
                        and (device is None or device.asynchronous))
        self._in_flight: StepInFlight | None = None
        #: with a drafter, propose the next step's drafts as soon as a step's tokens are taken, before
        #: the step's text and outputs are made: a speculative round's device then waits only for
        #: the host work its drafts depend on. On a device that runs queued work asynchronously
        #: (elsewhere drafting is done when propose returns, and the outputs would only wait for
        #: it); tests and benchmarks set it to compare
        self.early_propose = device is None or device.asynchronous
        if drafter is not None and self.early_propose:  # (a drafter may queue its next round early)
            runner.on_verified = drafter.on_verified
        self.metrics.counter("deepinfer:num_preemptions", "requests preempted for lack of KV blocks")
        for name in ("prompt_tokens", "prompt_tokens_computed", "generation_tokens",
                     "request_success", "request_aborted", "request_failed", "request_sampling_steps"):
            self.metrics.counter(f"deepinfer:{name}")
        for name in ("kv_cache_usage", "num_requests_running", "num_requests_waiting"):
            self.metrics.gauge(f"deepinfer:{name}")
        self.spec = Speculation(drafter, scheduler, self.metrics) if drafter is not None else None

    # ---------------------------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, cache_salt: str | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.ctx.model_config.get("vocab_size")
        if vocab is not None and (max(prompt_token_ids) >= vocab or min(prompt_token_ids) < 0):
            raise ValueError(f"prompt token ids must lie in [0, {vocab}) for this model")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {n} tokens but max_model_len is {self.max_model_len}: it must leave "
                "room for at least one new token; shorten the prompt or raise max_model_len")
        if self.spec is not None:
            self.spec.joined()
        self.table.add(request_id, prompt_token_ids, params, prompt, cache_salt)
        self.metrics.inc("deepinfer:prompt_tokens", n * params.n)
        self.hooks.deepinfer_request_added(request_id=request_id, num_prompt_tokens=n)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; False if it is not (or no longer) running."""
        if not self.table.abort(request_id):
            return False
        self.metrics.inc("deepinfer:request_aborted")
        self.hooks.deepinfer_request_aborted(request_id=request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def shutdown(self) -> None:
        """Abort what is still running (freeing its blocks) and tell the hook plugins."""
        for rid in list(self.requests):
            self.abort_request(rid)
        self.hooks.deepinfer_engine_stopped(engine=self)

    # -------------------------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return the requests that changed (or finished, see
        ``emit_unfinished``).

        With overlap, the step is launched on the device and left running: the previous step's
        results are taken in meanwhile, and this step's next call. Steps that need host-side
        state (drafts, logprobs, penalties) are waited for at once; with a drafter
        (``early_propose``), the next step's drafts are then proposed before this step's text and
        outputs are made, so that the draft's device work runs meanwhile.
        """
        self.hooks.deepinfer_step_begin(engine=self)
        touched: Touched = {}
        if self.spec is not None:  # (first any failure of the last step's early proposal)
            self.spec.begin_step(self.table.decoding, self._taker(touched))
        sched = self.scheduler.schedule()
        self.table.preempted(sched.preempted)
        flight = self.runner.launch(sched) if not sched.empty else None
        if self._in_flight is not None:  # the previous step finished on the device meanwhile
            self._take_deferred(self._in_flight, touched)
            self._in_flight = None
        defer = flight is not None and self.overlap and not flight.must_sync
        if flight is not None and not defer:
            self._take(flight, touched)
        if defer:
            self._begin_deferred(flight)
            self._in_flight = flight
        self.hooks.deepinfer_step_end(engine=self, num_tokens=sched.num_tokens)
        if self.spec is not None and self.early_propose and flight is not None and not defer:
            self.spec.propose_early(self.table.decoding)  # (the next step's drafts, before the outputs)
        outputs = self.table.emit(touched, self.emit_unfinished)
        self._update_gauges()
        return outputs

    def _take(self, flight: StepInFlight, touched: Touched) -> None:
        """Wait for a step and apply it: append its tokens, advance the requests, finish some."""
        result = self.runner.collect(flight)
        live = self.table.live(flight.sched)
        self.table.account(live, result)
        if self.spec is not None:
            self.spec.observe(live, result)
        finished = self.table.deliver([s.request for s in live.scheduled], result, touched)
        self.table.advance(live, result.num_rejected)
        self.table.finish(finished)

    def _begin_deferred(self, flight: StepInFlight) -> None:
        """A step left running: advance its requests now; those that sample get a placeholder."""
        live = self.table.live(flight.sched)
        self.table.account(live, flight.result)
        if self.spec is not None:
            self.spec.observe(live, flight.result)
        self.table.advance(live, flight.result.num_rejected)
        self.table.hold_places(flight.sampling)

    def _take_deferred(self, flight: StepInFlight, touched: Touched) -> None:
        """The samples of a step left running replace its requests' placeholders."""
        result = self.runner.collect(flight)
        self.table.finish(self.table.deliver(self.table.owned(flight.sampling), result, touched))

    def _taker(self, touched: Touched) -> Callable[[], None] | None:
        """Takes the step left running (None: there is none), for a drafter that needs its tokens."""
        if self._in_flight is None:
            return None

        def take() -> None:
            self._take_deferred(self._in_flight, touched)
            self._in_flight = None
        return take

    def _release(self, req: Request) -> None:
        """The request finished or was preempted: its draft goes (and the drafter's state for it)."""
        if self.spec is not None:
            self.spec.release(req)
        else:
            req.draft = None

    def _update_gauges(self) -> None:
        m = self.metrics
        m.set("deepinfer:kv_cache_usage", self.kv.usage)
        m.set("deepinfer:num_requests_running", self.scheduler.num_running)
        m.set("deepinfer:num_requests_waiting", self.scheduler.num_waiting)

    def get_metrics(self) -> dict[str, float]:
        self._update_gauges()
        return self.metrics.snapshot()
