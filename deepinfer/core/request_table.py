"""The core request table: every request the engine holds, and what happens to it after a step.

The scheduler only chooses (which requests run, how many tokens each computes, which to preempt);
everything a step's results change is done here, once, for every scheduler: the tokens appended
and the stop checks, ``num_computed_tokens`` advanced (less rejected drafts), the cache policies
told (``KVCacheManager.on_computed``), a request's status, and a finished request's blocks
released. A preemption's reset lives in the core too (``KVCacheManager.preempt``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from deepinfer.core.detokenizer import IncrementalDetokenizer
from deepinfer.core.grammar import Grammars
from deepinfer.core.interfaces import Scheduler, SchedulerOutput
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.metrics import Metrics
from deepinfer.core.model_runner import RunnerOutput
from deepinfer.core.request import Request, RequestOutput, RequestStatus
from deepinfer.core.request_state import RequestState, check_stop, stops_on_token
from deepinfer.core.sampler import UNUSABLE_TOKEN
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.tokenizer import Tokenizer

#: user request id -> its state, for the requests touched by a step (the ones to report)
Touched = dict[str, RequestState]


class PromptTooLongError(ValueError):
    """A prompt does not fit the model's context."""


class RequestTable:
    """The engine's requests by id, each with its sequences; updated from each step's results."""

    def __init__(self, scheduler: Scheduler, kv: KVCacheManager, metrics: Metrics, hooks: Any,
                 tokenizer: Tokenizer | None, eos_token_ids: frozenset[int], max_model_len: int,
                 vocab_size: int | None, release: Callable[[Request], None]) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.metrics = metrics
        self.hooks = hooks
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.release = release  # a sequence finished or was preempted (the drafter drops its state)
        self.requests: dict[str, RequestState] = {}
        self.grammars: Grammars | None = None  # built at the first request with structured outputs
        self.owner: dict[str, RequestState] = {}  # sequence id -> its user request
        metrics.counter("deepinfer:num_preemptions", "requests preempted for lack of KV blocks")
        for name in ("prompt_tokens", "prompt_tokens_computed", "generation_tokens",
                     "request_success", "request_aborted", "request_failed", "request_sampling_steps"):
            metrics.counter(f"deepinfer:{name}")

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.requests

    def __bool__(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------------------- add, abort
    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None,
            cache_salt: str | None) -> None:
        """One sequence a sample (``params.n``), each with its detokenizer, handed to the scheduler;
        a request that cannot run is refused first (ValueError saying what is wrong)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.vocab_size
        if vocab is not None and (max(prompt_token_ids) >= vocab or min(prompt_token_ids) < 0):
            raise ValueError(f"prompt token ids must lie in [0, {vocab}) for this model")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {n} tokens but max_model_len is {self.max_model_len}: it must leave "
                "room for at least one new token; shorten the prompt or raise max_model_len")
        compiled = self._compile(params)
        seqs, detoks = [], []
        for i in range(params.n):
            p = params
            if params.n > 1:
                # (the prompt's logprobs come from the first sequence: the others skip computing them)
                p = params.model_copy(update={"n": 1, "seed": None if params.seed is None else params.seed + i}
                                      | ({"prompt_logprobs": None} if i else {}))
            seq_id = request_id if params.n == 1 else f"{request_id}#{i}"
            seqs.append(Request(seq_id, list(prompt_token_ids), p, self.eos_token_ids, cache_salt,
                                self.max_model_len))
            if compiled is not None:  # (each sequence its own place in the grammar)
                seqs[-1].grammar = self.grammars.state(compiled)
            detoks.append(IncrementalDetokenizer(self.tokenizer, tuple(p.stop), p.include_stop_str_in_output,
                                                 p.skip_special_tokens, min_tokens=p.min_tokens))
        state = RequestState(request_id, prompt, list(prompt_token_ids), seqs, detoks)
        self.requests[request_id] = state
        for seq in seqs:
            self.owner[seq.request_id] = state
            self.scheduler.add_request(seq)
        self.metrics.inc("deepinfer:prompt_tokens", n * params.n)
        self.hooks.deepinfer_request_added(request_id=request_id, num_prompt_tokens=n)

    def _compile(self, params: SamplingParams) -> object | None:
        """The request's grammar compiled for the model's vocabulary (None: it has none);
        ValueError (GrammarError) naming what cannot be compiled."""
        spec = params.structured_outputs
        if spec is None:
            return None
        if self.tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer (tokenizer.json) to know what each "
                             "token spells; this model has none")
        if params.ignore_eos:
            raise ValueError("structured outputs end a sequence with its EOS once the grammar is complete: "
                             "they cannot be combined with ignore_eos")
        if self.grammars is None:
            self.grammars = Grammars(self.tokenizer, self.vocab_size or self.tokenizer.vocab_size,
                                     self.eos_token_ids)
        return self.grammars.compile(spec)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; False if it is not (or no longer) held."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return False
        for seq in state.seqs:
            self.owner.pop(seq.request_id, None)
            if not seq.status.finished:
                seq.status = RequestStatus.FINISHED_ABORTED
                self.finish([seq])
        self.metrics.inc("deepinfer:request_aborted")
        self.hooks.deepinfer_request_aborted(request_id=request_id)
        return True

    def finish(self, finished: Sequence[Request]) -> None:
        """Finished (or aborted) sequences leave the scheduler and release their blocks."""
        for req in finished:
            self.release(req)
            self.scheduler.remove_request(req)
            self.kv.free(req)

    # ------------------------------------------------------------------------- after a schedule
    def preempted(self, preempted: Sequence[Request]) -> None:
        """The schedule's victims (reset already by ``KVCacheManager.preempt``): counted, and their
        drafter state dropped."""
        for req in preempted:
            self.release(req)
        if preempted:
            self.metrics.inc("deepinfer:num_preemptions", len(preempted))

    # ----------------------------------------------------------------------------- after a step
    @staticmethod
    def live(sched: SchedulerOutput) -> SchedulerOutput:
        """The step without requests that finished (or were aborted) since it was planned."""
        if all(not s.request.status.finished for s in sched.scheduled):
            return sched
        return replace(sched, scheduled=tuple(s for s in sched.scheduled if not s.request.status.finished))

    def account(self, sched: SchedulerOutput, result: RunnerOutput) -> None:
        """A launched step's requests run; their prompt logprobs are kept and prompt tokens counted."""
        prompt = 0
        running = RequestStatus.RUNNING
        for s in sched.scheduled:
            req = s.request
            req.status = running  # (admitted by this step, or running already)
            start = req.num_computed_tokens
            if start < req.num_prompt_tokens:
                prompt += min(req.num_prompt_tokens, start + s.num_new_tokens) - start
            if req.request_id in result.prompt_logprobs:  # (positions start + 1 on, from 0 at 0)
                # a recomputation after a preemption gives positions held already: only the new ones
                held = len(req.prompt_logprobs) - (0 if start == 0 else start + 1)
                req.prompt_logprobs.extend(result.prompt_logprobs[req.request_id][max(0, held):])
        self.metrics.inc("deepinfer:prompt_tokens_computed", prompt)

    def advance(self, sched: SchedulerOutput, num_rejected: dict[str, int]) -> None:
        """The step ran: each request's computed tokens advance by what it scheduled less its
        rejected drafts (never past ``num_tokens``), and the cache policies are told."""
        kv = self.kv
        for s in sched.scheduled:
            req = s.request
            rejected = num_rejected.get(req.request_id, 0) if num_rejected else 0
            req.num_computed_tokens = min(req.num_computed_tokens + s.num_new_tokens - rejected, req.num_tokens)
            kv.on_computed(req)

    def hold_pending(self, sampling: Sequence[Request]) -> None:
        """A step left running: each request sampling in it has a token pending until it is taken."""
        for req in sampling:
            if not req.status.finished:
                req.num_pending += 1

    def owned(self, reqs: Sequence[Request]) -> list[Request]:
        """Those of ``reqs`` still held and unfinished (a step left running may outlive some)."""
        return [r for r in reqs if not r.status.finished and r.request_id in self.owner]

    def deliver(self, reqs: Sequence[Request], result: RunnerOutput, touched: Touched) -> list[Request]:
        """Append each request's sampled tokens up to a stop; return the ones that finished."""
        now = time.monotonic()
        finished: list[Request] = []
        sampling = 0
        for req in reqs:
            tokens = result.sampled.get(req.request_id)
            if tokens and tokens[0] == UNUSABLE_TOKEN:  # its logits were NaN or infinite: it alone ends
                req.num_pending = 0
                req.status = RequestStatus.FINISHED_ERROR
                touched[self.owner[req.request_id].request_id] = self.owner[req.request_id]
                finished.append(req)
            elif tokens:
                sampling += 1
                if self._append(req, tokens, result.logprobs.get(req.request_id), now, touched):
                    finished.append(req)
        self.metrics.inc("deepinfer:request_sampling_steps", sampling)
        return finished

    def _append(self, req: Request, tokens: list[int], logprobs, now: float, touched: Touched) -> bool:
        """Append the step's tokens up to a stop; True if the request finished."""
        state = self.owner[req.request_id]
        detok = state.detoks[state.seqs.index(req)]
        touched[state.request_id] = state
        if req.first_token_time is None:
            req.first_token_time = now
        later = not detok.stop  # no stop string: the text decides nothing here; it is made when read
        if req.num_pending:  # the first was sampled by a step that was left running
            req.num_pending -= 1
        for i, token in enumerate(tokens):
            req.all_token_ids.append(token)
            if req.grammar is not None and not req.grammar.accept(token):  # (masked: only if the row was unusable)
                req.status = RequestStatus.FINISHED_ERROR
                return True
            if logprobs and logprobs[i] is not None:
                req.logprobs.append(logprobs[i])
            # an EOS or stop token id that ends the request adds no text unless asked to (vLLM's)
            on_token = stops_on_token(req, token)
            silent = on_token and not detok.include_stop
            if check_stop(req, token, None if later or silent else detok.add([token]), on_token) or (
                    req.grammar is not None and req.grammar.done and _grammar_stop(req)):
                self.metrics.inc("deepinfer:generation_tokens", i + 1)
                if later:
                    detok.defer(tokens[:i + (0 if silent else 1)])
                return True
        self.metrics.inc("deepinfer:generation_tokens", len(tokens))
        if later:
            detok.defer(tokens)
        return False

    def emit(self, touched: Touched, unfinished: bool) -> list[RequestOutput]:
        """The touched requests' outputs (with ``unfinished`` False, finished ones only); finished
        requests leave the table."""
        outputs = []
        for rid, state in touched.items():
            if not (state.finished or unfinished):
                continue
            outputs.append(state.to_output())
            if state.finished:
                self.requests.pop(rid, None)
                for seq in state.seqs:
                    self.owner.pop(seq.request_id, None)
                failed = any(seq.status is RequestStatus.FINISHED_ERROR for seq in state.seqs)
                self.metrics.inc("deepinfer:request_failed" if failed else "deepinfer:request_success")
                self.hooks.deepinfer_request_finished(request_id=rid, output=outputs[-1])
        return outputs

    def decoding(self) -> list[Request]:
        """Sequences that are decoding: running, every token but the last computed, and past the
        tokens that must be sampled plainly (penalties, min_tokens)."""
        running = RequestStatus.RUNNING
        return [seq for state in self.requests.values() for seq in state.seqs
                if seq.status is running and seq.num_computed_tokens == seq.num_tokens - 1
                and seq.num_tokens >= seq.plain_from]


def _grammar_stop(req: Request) -> bool:
    """A grammar complete without a stop token (a model that has none) ends its sequence here."""
    req.status = RequestStatus.FINISHED_STOPPED
    return True
