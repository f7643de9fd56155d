"""Turns a SchedulerOutput into model inputs, runs the forward, and samples."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import torch

from deepinfer.core.capabilities import HandlesSingleRuns
from deepinfer.core.eager_batch import build_step_batch
from deepinfer.core.grammar import mask_drafts
from deepinfer.core.graphs import DecodeGraphs, PrefillGraphs
from deepinfer.core.host_copy import HostCopy, take_rows
from deepinfer.core.interfaces import AttentionBackend, DeviceGraphs, SchedulerOutput
from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.core.model_registry import CausalLM
from deepinfer.core.request import Request
from deepinfer.core.sampler import Sampler, mark_unusable, plain_greedy


@dataclass(slots=True)
class RunnerOutput:
    """Per request id: the tokens it gained this step (empty while its prefill is unfinished)."""

    sampled: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)
    num_rejected: dict[str, int] = field(default_factory=dict)  # drafts whose KV is rolled back
    num_verified: dict[str, int] = field(default_factory=dict)


def _one_source(current: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    if current is not None and current is not new:
        raise RuntimeError("a step's placeholders stand for rows of two device tensors (a step left running and "
                           "drafts on the device, or two drafting rounds); the engine keeps them apart")
    return new


@dataclass(slots=True)
class StepInFlight:
    """A launched step. ``result`` holds what was computed at launch (verifications, prompt
    logprobs); the samples of ``sampling`` are in ``tokens`` on the device until the next step is
    launched (greedy samples share a buffer that the next step overwrites), and in ``host``."""

    sched: SchedulerOutput
    result: RunnerOutput
    sampling: list[Request]
    tokens: torch.Tensor | None = None   # [len(sampling)] int64, on the device
    host: HostCopy | None = None         # their copy to host memory
    #: the engine must collect this step before planning the next (drafts, logprobs, penalties)
    must_sync: bool = False
    #: recorded after the step's device work when no samples of it go to the host (a prefill
    #: chunk that samples nothing): ``collect`` waits for it, so that a collected step is always
    #: finished and at most one is in flight (graph replays refill their host buffers two steps
    #: apart). Not for verifications, waited for at launch (not the drafter's work queued behind)
    done: Any = None
    #: the engine left it running while it planned the next (its requests advanced at launch)
    left_running: bool = False


class ModelRunner:
    """Owns the model, its KV caches and the sampler; executes one step at a time."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, kv_caches: list[Any],
                 block_size: int, device: torch.device, sampler: Sampler, kv_groups: int = 1) -> None:
        self.model = model
        self.attention = attention
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = sampler
        self.graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None  # steps of up to query_len tokens a sequence
        #: the same for steps in which every sequence verifies drafts (2+ tokens): no decode pass
        self.verify_graphs_multi: DecodeGraphs | None = None
        #: steps of one sequence computing several tokens (a prompt), one set a token count
        self.prefill_graphs: PrefillGraphs | None = None
        #: (start, end, decode_only) of every launched step, when a benchmark sets it to a list:
        #: device events recorded just before the step's first device work and after its last
        self.timeline: list[tuple[Any, Any, bool]] | None = None
        self._prev_tokens: torch.Tensor | None = None  # the last launched step's samples
        self._buffer_copy: HostCopy | None = None  # the host copy of the samples in graphs.prev_tokens
        self._prev_rows: dict[str, int] = {}            # request id -> row of _prev_tokens
        self.on_verified: Callable[..., None] | None = None  # the drafter's, where the engine chains rounds
        self.kv_groups = kv_groups
        #: with tensor parallelism, the other ranks (``deepinfer.parallel.driver.Driver``): told each
        #: eager step's inputs and each logits call, so that they run their shards of the same work
        self.ranks: Any = None

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: Sequence[int], max_seq_len: int) -> None:
        """Capture decode steps for these batch sizes (sequences up to ``max_seq_len`` tokens)."""
        self._check_graphs()
        g = DecodeGraphs(self.model, self.attention, self.kv_caches, graphs, self.device, self.block_size,
                         batch_sizes, max_seq_len, head_graphs=True)
        g.capture()
        self.graphs = g

    def _check_graphs(self) -> None:
        if self.kv_groups > 1:
            raise ValueError(f"device graphs replay steps with one KV group, and this engine has {self.kv_groups} "
                             "(a cache policy keeps the sliding-window layers' KV in a pool of their own): its steps "
                             "run eagerly; turn graphs off (enforce_eager)")
        if not self.attention.supports_graphs:
            raise ValueError(f"the attention plugin {self.attention.name!r} cannot run in device graphs (it does not "
                             "declare supports_graphs); use one that does, or turn graphs off (enforce_eager)")

    def enable_prefill_graphs(self, graphs: DeviceGraphs, token_sizes: Sequence[int], max_seq_len: int) -> None:
        """Capture steps of one sequence computing up to each of ``token_sizes`` tokens (see
        ``PrefillGraphs``), for sequences up to ``max_seq_len`` tokens."""
        self._check_graphs()
        g = PrefillGraphs(self.model, self.attention, self.kv_caches, graphs, self.device, self.block_size,
                          token_sizes, max_seq_len)
        g.capture()
        self.prefill_graphs = g

    def enable_verify_graphs(self, graphs: DeviceGraphs, batch_sizes: Sequence[int], max_seq_len: int,
                             query_len: int) -> None:
        """Also capture steps of up to ``query_len`` tokens per sequence (speculative decoding's
        verification: the last token and up to query_len - 1 drafts), in graphs of their own. Where
        attention gives one-token runs a decode pass, they take such runs, and a second set without
        the pass serves the steps in which every sequence verifies at least one draft; elsewhere
        one set takes steps of two or more tokens a sequence."""
        if self.graphs is None:
            raise ValueError("enable decode graphs first (enable_graphs)")
        args = (self.model, self.attention, self.kv_caches, graphs, self.device, self.block_size, batch_sizes,
                max_seq_len, query_len)
        singles = isinstance(self.attention, HandlesSingleRuns) and self.attention.handles_single_runs
        self.verify_graphs = DecodeGraphs(*args, single_runs=singles, greedy_head=True)
        self.verify_graphs.capture()
        if singles:
            self.verify_graphs_multi = DecodeGraphs(*args, single_runs=False, greedy_head=True)
            self.verify_graphs_multi.capture()

    def _inputs(self, out: SchedulerOutput) -> tuple[list[tuple[list[int], int, list[int]]], torch.Tensor | None]:
        """Per request: tokens to compute, the first one's position, the block table; and the
        device tensor the step's placeholders stand for rows of (None: there are none). A
        placeholder -(row+1) is the previous step's sample of that row (a step left running) or a
        draft still on the device (a proposal with a ``source``); one step never has both."""
        seqs, prev = [], None
        for sch in out.scheduled:
            r, n = sch.request, sch.num_new_tokens
            drafts = out.draft_tokens.get(r.request_id, [])
            start = r.num_computed_tokens
            end = start + n - len(drafts)
            tokens = r.all_token_ids[start:end]
            if end > len(r.all_token_ids):  # its pending token: the step left running samples it
                row = self._prev_rows.get(r.request_id)
                if row is None or end - len(r.all_token_ids) != 1:
                    raise RuntimeError(f"request {r.request_id} waits for a token no launched step samples")
                tokens.append(-(row + 1))
                prev = _one_source(prev, self._prev_tokens)
            if drafts and r.draft is not None and r.draft.source is not None:
                prev = _one_source(prev, r.draft.source.tokens)
            seqs.append((tokens + drafts, start, r.block_ids))
        return seqs, prev

    def _sliding(self, out: SchedulerOutput) -> list[tuple[list[int], int]] | None:
        """Per request, the sliding-window pool's block table and replay_until (one KV group: None)."""
        if self.kv_groups == 1:
            return None
        return [(s.request.sliding_block_ids, s.request.replay_until) for s in out.scheduled]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """Run one step and wait for its results."""
        return self.collect(self.launch(out))

    def launch(self, out: SchedulerOutput) -> StepInFlight:
        """Queue one step on the device; the samples stay there (see ``collect``). With tensor
        parallelism, a failure of any rank ends every rank and raises ``WorkerError``."""
        if self.ranks is None:
            return self._launch(out)
        try:
            return self._launch(out)
        except Exception as e:
            raise self.ranks.failure(e) from e
        except BaseException:  # (interrupted mid-step: the other ranks are out of step with this one)
            self.ranks.shutdown("a step was interrupted")
            raise

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any."""
        if self.ranks is not None:
            self.ranks.shutdown()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.ranks is not None:  # (every rank computes its part of the vocabulary)
            self.ranks.send_logits(hidden)
        return self.model.compute_logits(hidden)

    def _forward(self, out: SchedulerOutput, seqs: list[tuple[list[int], int, list[int]]],
                 prev: torch.Tensor | None) -> torch.Tensor:
        """An eager step's hidden states. With data-parallel ranks (``ranks.runs_step``) each rank runs
        its own sequences and rank 0 gets every row; with tensor-parallel ones each runs its shard."""
        def forward(part: list[tuple[list[int], int, list[int]]],
                    sliding: list[tuple[list[int], int]] | None = None) -> torch.Tensor:
            batch = build_step_batch(part, self.block_size, self.device, sliding, prev,
                                     ops=getattr(self.model, "fused_ops", None))
            return self.model(batch.input_ids, batch.positions, self.kv_caches, self.attention.build_metadata(batch))

        if getattr(self.ranks, "runs_step", False):
            return self.ranks.run_step([s.request for s in out.scheduled], seqs, prev, forward)
        sliding = self._sliding(out)
        if self.ranks is not None:
            self.ranks.send_step(seqs, sliding, prev)
        return forward(seqs, sliding)

    @torch.inference_mode()
    def _launch(self, out: SchedulerOutput) -> StepInFlight:
        seqs, prev = self._inputs(out)
        decode_only = not out.draft_tokens and all(len(t) == 1 for t, _, _ in seqs)
        timing = None
        if self.timeline is not None:
            timing = (torch.Event(self.device, enable_timing=True), torch.Event(self.device, enable_timing=True),
                      decode_only)
        mark = timing[0].record if timing is not None else None
        graph_size = padded = padded_size = head = None
        if self.graphs is not None and decode_only:
            graph_size = self.graphs.size_for(len(seqs), max(start + 1 for _, start, _ in seqs))
        elif (padded := self._padded_graphs(seqs, bool(out.draft_tokens))) is not None:
            padded_size = padded.size_for(len(seqs), max(s + len(t) for t, s, _ in seqs))
        if graph_size is not None or padded_size is not None:
            tokens, starts, tables = zip(*seqs, strict=True)
        if graph_size is not None:
            hidden = self.graphs.run(graph_size, [t[0] for t in tokens], starts, tables, prev_tokens=prev,
                                     on_device=mark)
        elif padded_size is not None:  # sequence i's rows start at i * query_len
            hidden = padded.run_padded(padded_size, tokens, starts, tables, on_device=mark, prev_tokens=prev)
            head = padded.last_head
        else:
            if mark is not None:
                mark()
            hidden = self._forward(out, seqs, prev)
        result = RunnerOutput()
        rows: list[int] = []
        sampling: list[Request] = []
        verifying: list[tuple[Request, list[int], int]] = []  # request, drafts, first logits row
        start = 0
        for i, s in enumerate(out.scheduled):
            r, n = s.request, s.num_new_tokens
            if padded_size is not None:
                start = i * padded.query_len
            end = start + n
            drafts = out.draft_tokens.get(r.request_id, [])
            if (r.params.prompt_logprobs is not None and r.num_computed_tokens < r.num_prompt_tokens
                    and len(r.prompt_logprobs) < r.num_prompt_tokens):  # (not all held from before a preemption)
                result.prompt_logprobs[r.request_id] = self._prompt_logprobs(hidden[start:end], r, n)
            if drafts:
                verifying.append((r, drafts, end - 1 - len(drafts)))
            elif r.num_computed_tokens + n >= r.num_tokens:  # caught up: the next token is new
                rows.append(end - 1)
                sampling.append(r)
            else:
                result.sampled[r.request_id] = []
            start = end
        flight = StepInFlight(out, result, sampling,
                              must_sync=bool(verifying) or not all(s.request.overlappable for s in out.scheduled))
        # (queued before on_verified may queue a drafter's graph, which may reuse the pool memory under hidden)
        logits = self._logits(take_rows(hidden, rows)) if sampling and flight.must_sync else None
        if verifying:
            self._verify(hidden, verifying, result, head)
        if sampling:
            if flight.must_sync:
                tokens, logprobs = self.sampler(logits, sampling)
                for r, t, lp in zip(sampling, tokens, logprobs, strict=True):
                    result.sampled[r.request_id] = [t]
                    result.logprobs[r.request_id] = [lp]
            else:
                # greedy samples go straight into the decode graphs' buffer of placeholder values,
                # which the next step's replay reads without a copy
                buf = self.graphs.prev_tokens if self.graphs is not None else None
                into = buf[:len(sampling)] if buf is not None and buf.numel() >= len(sampling) else None
                if into is not None and self._buffer_copy is not None:
                    self._buffer_copy.before_overwrite()  # the last samples there have reached the host
                # a decode replay whose every sample is a plain argmax: its head graph writes them there
                if graph_size is not None and len(sampling) == len(seqs) and plain_greedy(sampling) \
                        and (argmaxes := self.graphs.replay_head(graph_size)) is not None:
                    flight.tokens = argmaxes[:len(sampling)]
                else:
                    logits = self._logits(take_rows(hidden, rows))
                    flight.tokens = self.sampler.sample_on_device(logits, sampling, out=into)
                self._prev_tokens = flight.tokens
                self._prev_rows = {r.request_id: i for i, r in enumerate(sampling)}
                # their copy to the host runs beside the next step's work, not in line with it
                # (rows that could not be sampled are marked in the host's copy: see sampler.UNUSABLE_TOKEN)
                marked = flight.tokens if logits is None else mark_unusable(logits, flight.tokens)
                flight.host = HostCopy(marked, aside=True)
                if into is not None and flight.tokens.data_ptr() == into.data_ptr():
                    self._buffer_copy = flight.host
        if timing is not None:
            timing[1].record()
            self.timeline.append(timing)
        if flight.tokens is None and not verifying and self.device.type != "cpu":  # (verifications were waited for)
            flight.done = torch.Event(self.device)
            flight.done.record()
        return flight

    def _padded_graphs(self, seqs: list[tuple[list[int], int, list[int]]], drafts: bool) -> DecodeGraphs | None:
        """The graphs of several rows a sequence that a step of more than one token a sequence may
        replay (if its sizes allow): verification graphs for a step with drafts, prefill graphs for
        one sequence's tokens; None: none fit."""
        if drafts and self.verify_graphs is not None:
            # one-token runs (requests not speculating this step) are flagged in the graph's inputs,
            # and attention gives them the decode kernel there, as in an eager step; a backend that
            # cannot verifies such steps eagerly
            g, q = self.verify_graphs, self.verify_graphs.query_len
            if not all((1 if g.takes_single_runs else 2) <= len(t) <= q for t, _, _ in seqs):
                return None
            if self.verify_graphs_multi is not None and all(len(t) > 1 for t, _, _ in seqs):
                return self.verify_graphs_multi  # no one-token run: the graphs without the decode pass
            return g
        if not drafts and self.prefill_graphs is not None and len(seqs) == 1:
            tokens, start, _ = seqs[0]
            return self.prefill_graphs.graphs_for(len(tokens), start + len(tokens))
        return None

    def collect(self, flight: StepInFlight) -> RunnerOutput:
        """Wait for a launched step (its samples) and return its whole result."""
        result = flight.result
        if flight.done is not None:
            flight.done.synchronize()
        if flight.tokens is not None:
            for r, t in zip(flight.sampling, flight.host.wait().tolist(), strict=True):
                result.sampled[r.request_id] = [t]
        return result

    def _verify(self, hidden: torch.Tensor, verifying, result: RunnerOutput, head: torch.Tensor | None = None) -> None:
        from deepinfer.core.sampler import rows_top_logprobs
        from deepinfer.core.verification import accept_greedy, verify_batch

        index = [row + j for _, drafts, row in verifying for j in range(len(drafts) + 1)]
        grammar = any(r.grammar is not None for r, _, _ in verifying)
        plain = head is not None and not grammar and all(r.params.greedy and r.params.logprobs is None
                                                         for r, _, _ in verifying)
        logits = None if plain else self._logits(take_rows(hidden, index))  # (head: greedy_head's)
        if grammar:  # a draft its grammar forbids gets probability 0: it is rejected
            mask_drafts(logits, verifying)
        # greedy argmaxes in one kernel and copy; a drafter may queue work behind them (on_verified)
        best = None
        if any(r.params.greedy for r, _, _ in verifying):
            copy = HostCopy(best := take_rows(head, index) if plain else self.sampler.argmax(logits))
            if self.on_verified is not None and all(r.params.greedy for r, _, _ in verifying):
                starts = list(accumulate((len(d) + 1 for _, d, _ in verifying), initial=0))
                self.on_verified([(r, d, at) for (r, d, _), at in zip(verifying, starts, strict=False)], best, copy)
            best = copy.wait().tolist()
        if any(not r.params.greedy or r.params.logprobs is not None for r, _, _ in verifying):
            logits = logits.float()  # (float32 rows only for rejection sampling and logprobs)
        resolved, firsts, sampled = [], [], []  # each request's drafts and first logits row; the sampled ones
        at = 0
        for r, drafts, _ in verifying:
            if r.draft is not None and r.draft.source is not None:  # drafts that were still on the device
                drafts = r.draft.source.resolve(drafts)
            resolved.append(drafts)
            firsts.append(at)
            if not r.params.greedy:
                q = r.draft.probs if r.draft is not None else None
                sampled.append((r, drafts, None if q is None else q[:len(drafts)]))
            at += len(drafts) + 1
        if sampled:  # rejection sampling for them all at once, on the logits' device
            rows = [i for (r, d, _), at in zip(verifying, firsts, strict=True) if not r.params.greedy
                    for i in range(at, at + len(d) + 1)]
            drawn = iter(verify_batch(logits[rows] if len(rows) < len(logits) else logits, sampled,
                                      self.sampler.generator))
        for (r, _, _), drafts, at in zip(verifying, resolved, firsts, strict=True):
            tokens = accept_greedy(drafts, best[at:at + len(drafts) + 1]) if r.params.greedy else next(drawn)
            result.sampled[r.request_id] = tokens
            result.num_rejected[r.request_id] = len(drafts) + 1 - len(tokens)
            result.num_verified[r.request_id] = len(drafts)
            if r.params.logprobs is not None:
                lps = logits[at:at + len(tokens)].log_softmax(-1)
                result.logprobs[r.request_id] = rows_top_logprobs(lps, tokens, r.params.logprobs)

    #: prompt positions whose logprobs are computed at once (a chunk's logits over a large vocabulary
    #: in float32, whole, would take gigabytes beside the activations the KV sizing left room for)
    PROMPT_LOGPROBS_ROWS = 512

    def _prompt_logprobs(self, hidden: torch.Tensor, r: Request, n: int) -> list[TokenLogprobs | None]:
        """Logprobs of prompt tokens start+1 .. start+n given what precedes them (vLLM's meaning)."""
        from deepinfer.core.sampler import rows_top_logprobs

        start = r.num_computed_tokens
        out: list[TokenLogprobs | None] = [None] if start == 0 else []
        n = min(n, r.num_prompt_tokens - start - 1)  # (the last prompt token's next is no prompt token)
        for j in range(0, n, self.PROMPT_LOGPROBS_ROWS):
            rows = min(self.PROMPT_LOGPROBS_ROWS, n - j)
            lps = self._logits(hidden[j:j + rows]).float().log_softmax(-1)
            nxt = r.prompt_token_ids[start + j + 1:start + j + 1 + rows]
            out.extend(rows_top_logprobs(lps, nxt, r.params.prompt_logprobs))
        return out
