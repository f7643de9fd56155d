"""The engine's side of speculative decoding: asking the drafter, capping and keeping its drafts,
counting and reporting their verification, and the drafter's rests and early proposals.

The engine calls ``begin_step`` before each schedule, ``propose_early`` after a step it waited for,
``observe`` with each step's results and ``release`` for a request that finished or was preempted;
verification itself is the model runner's (``deepinfer/core/verification.py``), so every drafter is
lossless.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from deepinfer.core.capabilities import Rests, SkipsRounds
from deepinfer.core.interfaces import Device, Drafter, Scheduler, SchedulerOutput
from deepinfer.core.metrics import Metrics
from deepinfer.core.model_runner import RunnerOutput
from deepinfer.core.request import Request


def plans_ahead(scheduler: Scheduler, drafter: Drafter | None, device: Device | None) -> bool:
    """Whether the engine plans step N+1 while step N runs: the scheduler's choice, on a device that
    runs queued work asynchronously, without a drafter (which needs every token on the host) or with
    one that says before each proposal whether it drafts (``SkipsRounds``)."""
    return bool(scheduler.overlap
                and (drafter is None or isinstance(drafter, SkipsRounds) and drafter.skips_rounds)
                and (device is None or device.asynchronous))


class Speculation:
    """Drafts for the decoding sequences of each step, from one drafter."""

    def __init__(self, drafter: Drafter, scheduler: Scheduler, metrics: Metrics) -> None:
        self.drafter = drafter
        self.scheduler = scheduler
        self.metrics = metrics
        self._proposed = False  # this step's drafts were proposed at the end of the last step
        self._rest_above: int | None = None  # the drafter rests while at least this many run (Rests)
        self._skips, self._rests = isinstance(drafter, SkipsRounds), isinstance(drafter, Rests)  # (asked once)
        self._error: Exception | None = None  # an early proposal's, raised at the next step
        for name in ("num_drafts", "num_draft_tokens", "num_verified_tokens", "num_accepted_tokens"):
            metrics.counter(f"deepinfer:spec_decode_{name}")
        self._position_names: list[str] = []  # the metric of accepted drafts at each position
        for _ in range(drafter.max_draft_tokens or 0):  # (from 0, as vLLM's; later ones when first seen)
            self._position_names.append(f"deepinfer:spec_decode_num_accepted_tokens_pos_{len(self._position_names)}")
            metrics.counter(self._position_names[-1])

    def joined(self) -> None:
        """A request was added: the drafter is asked again (a rest ends)."""
        self._rest_above = None

    def begin_step(self, decoding: Callable[[], list[Request]], take: Callable[[], None] | None) -> None:
        """Before a schedule: raise the last early proposal's failure (where the proposal would have
        raised it), or propose this step's drafts unless that proposal made them."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if not self._proposed:
            self.propose(decoding, take)
        self._proposed = False

    def propose_early(self, decoding: Callable[[], list[Request]]) -> None:
        """The next step's drafts, right after a step was taken: their device work is queued while
        the host makes this step's text and outputs (the next schedule may still preempt or finish
        a request: its draft is then dropped as it would be otherwise). A failure is raised at the
        next step (``begin_step``), so this step's outputs still go out."""
        try:
            self.propose(decoding, None)
            self._proposed = True
        except Exception as e:  # noqa: BLE001 (not swallowed: raised at the next step)
            self._error = e

    def propose(self, decoding: Callable[[], list[Request]], take: Callable[[], None] | None) -> None:
        """Ask the drafter for drafts for every sequence that is decoding (``decoding()``) and may
        speculate; with a step left running (``take`` takes it), first take it if the drafter needs
        its tokens (``SkipsRounds.needs_tokens``); none while the drafter rests (``Rests.rests_above``:
        every sequence's draft is then None)."""
        sched = self.scheduler
        if self._rest_above is not None and not sched.num_waiting and sched.num_running >= self._rest_above:
            return
        self._rest_above = None
        seqs = decoding()
        blind = take is not None and bool(seqs)  # (a last token may be pending)
        if blind and (not self._skips or self.drafter.needs_tokens(seqs)):
            take()
            blind = False
            seqs = decoding()  # (some may have finished)
        proposals = self.drafter.propose(seqs) if seqs else {}
        if blind and any(p.tokens for p in proposals.values()):
            raise RuntimeError(f"the drafter {self.drafter.name!r} answered needs_tokens() False, then proposed "
                               "drafts for requests whose last tokens were not known yet; after False it must "
                               "propose nothing")
        if not proposals:  # a round without drafts (every step, for some drafters at large batches)
            for seq in seqs:
                seq.draft = None
            # a rest only while every sequence decodes (none waits or computes its prompt: a join is an add)
            whole = bool(seqs) and not sched.num_waiting and len(seqs) == sched.num_running
            self._rest_above = self.drafter.rests_above() if whole and self._rests else None
            return
        for seq in seqs:
            prop = proposals.get(seq.request_id)
            seq.draft = None
            if prop is None or not prop.tokens:
                continue
            if not prop.verified:  # drafted, none worth verifying: proposed all the same
                self._count_drafts(len(prop.tokens))
                continue
            # the drafts and the token after them stay within the context and max_tokens (tokens
            # past either would be cut: verifying them would cost KV and compute for nothing)
            room = seq.max_model_len - seq.num_tokens - 1
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
            if room > 0:
                if len(prop.verified) > room:  # (only the leading ones: lossless whatever their values)
                    prop = replace(prop, num_verify=room)
                seq.draft = prop  # (counted once verified: observe; a preemption or abort drops it)

    @staticmethod
    def with_drafts(sched: SchedulerOutput) -> SchedulerOutput:
        """The schedule with each request's drafts: those of the tokens it was given past its
        ``num_tokens`` (the scheduler counts them; the leading ones of its proposal are verified)."""
        drafts = {}
        for s in sched.scheduled:
            req = s.request
            extra = s.num_new_tokens - (req.num_tokens - req.num_computed_tokens)
            if extra > 0:
                if extra > req.num_draft_tokens:
                    raise RuntimeError(f"the scheduler gave request {req.request_id} {extra} tokens past its last, "
                                       f"but it has {req.num_draft_tokens} drafts to verify (Request.num_draft_tokens)")
                drafts[req.request_id] = req.draft.verified[:extra]
        return replace(sched, draft_tokens=drafts) if drafts else sched

    def _count_drafts(self, num_tokens: int) -> None:
        """One request's proposal, once verified (or once the drafter proposed it for no
        verification): a draft round of ``num_tokens`` tokens proposed."""
        self.metrics.inc("deepinfer:spec_decode_num_drafts")
        self.metrics.inc("deepinfer:spec_decode_num_draft_tokens", num_tokens)

    def observe(self, sched: SchedulerOutput, result: RunnerOutput) -> None:
        """A step's verifications: counted, and the drafter told (``Drafter.observe``)."""
        if not result.num_verified:
            return
        m = self.metrics
        names = self._position_names
        for s in sched.scheduled:
            req = s.request
            num_verified = result.num_verified.get(req.request_id)
            if num_verified is None:
                continue
            accepted = num_verified - result.num_rejected[req.request_id]
            self._count_drafts(len(req.draft.tokens))  # (the proposal verified, its tokens until now)
            m.inc("deepinfer:spec_decode_num_verified_tokens", num_verified)
            m.inc("deepinfer:spec_decode_num_accepted_tokens", accepted)
            while len(names) < accepted:
                names.append(f"deepinfer:spec_decode_num_accepted_tokens_pos_{len(names)}")
            for pos in range(accepted):
                m.inc(names[pos])
            self.drafter.observe(req, num_verified, accepted)
            req.draft = None

    def release(self, req: Request) -> None:
        """The request finished or was preempted: its draft goes, and the drafter's state for it."""
        req.draft = None
        self.drafter.release(req)
