"""Steps replayed from device graphs: one capture per batch size of a ladder.

A decode-only step of ``b`` sequences runs the graph of the smallest captured size ``B >= b``.
The graphs read their inputs from static tensors that each step refills (rows ``b..B`` are
padding: length 0, slot -1, so they write nothing and their output is ignored). Attention reads
at most ``max_seq_len`` keys per sequence; a step with a longer sequence runs eagerly.

With ``query_len`` Q > 1 (verification steps of speculative decoding: a request's last token and
its drafts) every sequence gets Q query rows, rows ``i*Q .. i*Q+Q-1`` of the output; a sequence
with fewer tokens is padded at its end with rows that write no KV (slot -1) and whose outputs are
ignored. Causal attention keeps the real rows from seeing the padding. A sequence with one real
token is flagged (``StepBatch.single_runs``), so that attention can give it the decode kernel, as
an eager step would; graphs built with ``single_runs=False`` take only sequences of two tokens or
more and leave that pass out (for the steps in which every sequence verifies drafts).

``PrefillGraphs`` keeps sets of such graphs for steps of one sequence computing many tokens (a
prompt at low load), one set a token count.

A step's inputs go to the device in one copy: each batch size has its own layout of the input
fields in one shared buffer (``PackedInputs``), so a replay copies exactly its size's bytes. Small
sizes need no copy where the device's fused ops offer ``stage_inputs``: their replay's first
kernel reads the fields from pinned host memory (``PackedInputs.staged``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import AttentionBackend, DeviceGraphs
from deepinfer.core.model_registry import CausalLM
from deepinfer.core.packed_inputs import PackedInputs
from deepinfer.core.step_batch import StepBatch


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to 256, capped at max_num_seqs (which is always in)."""
    ladder = [1, 2, 4] + list(range(8, 257, 8))
    sizes = sorted({s for s in ladder if s < max_num_seqs} | {min(max_num_seqs, 256)})
    return sizes


def default_prefill_sizes(max_tokens: int) -> list[int]:
    """Token counts of the prefill graphs: 16, 32, 64, 128, 256, 384, 512, 768 and 1,024, up to
    the first at or above ``max_tokens`` (see ``usable_prefill_sizes``). A step pads to the next
    count, so past 256 tokens its rows grow by at most half; each count costs start-up time (its
    first run, on the H200 about 0.25 s)."""
    return usable_prefill_sizes([16, 32, 64, 128, 256, 384, 512, 768, 1024], max_tokens)


def usable_prefill_sizes(sizes: Sequence[int], max_tokens: int) -> list[int]:
    """The token counts a step of at most ``max_tokens`` tokens (the step budget, or the longest
    sequence captured) may replay: those below it and the first at or above it."""
    ordered = sorted(set(sizes))
    return [s for s in ordered if s < max_tokens] + [s for s in ordered if s >= max_tokens][:1]


def resolve_placeholders(ids: torch.Tensor, prev_tokens: torch.Tensor, out: torch.Tensor | None = None,
                         ops: FusedOps | None = None) -> torch.Tensor:
    """``ids`` with each negative entry -(r+1) replaced by ``prev_tokens[r]``, on the device (into
    ``out``, which may be ``ids`` itself): in one launch where the device's fused ``ops`` offer
    ``resolve_placeholders``, else in five small torch kernels."""
    fused = getattr(ops, "resolve_placeholders", None)
    if fused is not None:
        return fused(ids, prev_tokens, out=out)
    rows = torch.bitwise_not(ids).clamp_(min=0)  # -(r+1) -> r; real tokens -> 0
    return torch.where(ids < 0, prev_tokens[rows], ids, out=out)


class DecodeGraphs:
    """Static input tensors, one captured forward per batch size, and the code that fills them."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, kv_caches: list[Any],
                 graphs: DeviceGraphs, device: torch.device, block_size: int, batch_sizes: Sequence[int],
                 max_seq_len: int, query_len: int = 1, placeholders: bool = True,
                 single_runs: bool = True, greedy_head: bool = False, head_graphs: bool = False) -> None:
        """``placeholders``: the replays resolve placeholder tokens themselves (one kernel, which
        for small sizes also stages the inputs: see the module's docstring); False for graphs
        that are never given any (a drafter's, the prefill graphs), which then resolve any that
        come before the replay and always copy their inputs. ``single_runs`` (query_len > 1): sequences of one token may
        come, flagged for attention's decode pass; False: every sequence brings 2 to query_len
        tokens, and the graphs hold no such pass. ``greedy_head`` (verification graphs): a replay
        also takes every row's argmax over the LM head's logits (``last_head``), so that a greedy
        verification launches nothing of its own after the replay (each launch costs the host tens
        of microseconds on an H200's host, more while the device is busy); sizes whose logits
        would exceed ``HEAD_MAX_ELEMENTS`` leave it to the caller. ``head_graphs`` (one-token graphs
        with placeholders: decode steps): a second graph a size takes the argmax of every row's
        logits over the forward's output into ``prev_tokens`` (``replay_head``), replayed only for
        steps whose every sample is a plain argmax, so that steps that sample otherwise compute no
        logits twice."""
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"graph batch sizes must be positive integers, got {list(batch_sizes)}")
        if query_len < 1:
            raise ValueError(f"query_len must be at least 1, got {query_len}")
        if head_graphs and (query_len != 1 or not placeholders):
            raise ValueError("head graphs write a decode step's argmaxes into its buffer of placeholder values: "
                             "they need query_len 1 and placeholders")
        self.model, self.attention, self.kv_caches = model, attention, kv_caches
        self.api = graphs
        self.device = device
        self.block_size = block_size
        self.sizes = sorted(set(batch_sizes))
        self.max_batch = self.sizes[-1]
        self.max_seq_len = max_seq_len
        self.max_blocks = -(-max_seq_len // block_size)
        self.query_len = q = query_len
        self.takes_single_runs = single_runs or q == 1
        n, dev = self.max_batch, device
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev) * q
        self._no_context = torch.zeros(n, dtype=torch.int32, device=dev)  # one-token steps never read it
        #: the values of this step's placeholders (tokens still on the device), resolved in the graph
        self.prev_tokens = torch.zeros(n * q if placeholders else 0, dtype=torch.long, device=dev)
        # small sizes read their inputs from host memory in their first kernel, where the device's
        # kernels offer it (graphs with placeholders: that kernel resolves them too)
        staged = getattr(self.fused_ops, "stage_max_bytes", 0) if placeholders else 0
        self.inputs = PackedInputs(self._fields(), self.sizes, dev, pin=dev.type != "cpu", staged_bytes=staged)
        self._turn = self._filled = 0  # the host buffer the next step fills; the one it filled
        self._replays: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        self.greedy_head = greedy_head
        self._heads: dict[int, torch.Tensor] = {}  # size -> its replay's argmaxes (greedy_head)
        self.head_graphs = head_graphs
        self._head_replays: dict[int, Callable[[], None]] = {}  # size -> its head graph (head_graphs)
        #: the last replay's argmax of every row's logits [size * query_len] (None: not computed)
        self.last_head: torch.Tensor | None = None

    def _fields(self) -> dict[str, tuple[torch.dtype, Callable[[int], tuple[int, ...]]]]:
        """The input fields of a step of b sequences (a subclass may add its own)."""
        q, mb = self.query_len, self.max_blocks
        fields = {"ids": (torch.long, lambda b: (b * q,)), "pos": (torch.long, lambda b: (b * q,)),
                  "slots": (torch.long, lambda b: (b * q,)), "lens": (torch.int32, lambda b: (b,)),
                  "tables": (torch.int32, lambda b: (b, mb))}
        if q > 1:  # one-token steps never read the context lengths
            fields["ctx"] = (torch.int32, lambda b: (b,))
            if self.takes_single_runs:
                fields["single"] = (torch.bool, lambda b: (b,))
        return fields

    def _batch(self, b: int) -> StepBatch:
        q, ins = self.query_len, self.inputs.device(b)
        return StepBatch(
            input_ids=ins["ids"], positions=ins["pos"], slot_mapping=ins["slots"],
            query_start_loc=self.query_start_loc[:b + 1], seq_lens=ins["lens"],
            context_lens=ins["ctx"] if "ctx" in ins else self._no_context[:b], block_tables=ins["tables"],
            query_lens_cpu=(q,) * b, seq_lens_cpu=(self.max_seq_len,) * b, block_size=self.block_size,
            max_query_len=q, max_seq_len=self.max_seq_len, single_runs=ins.get("single"))

    @torch.inference_mode()
    def capture(self) -> None:
        """Record the forward of every batch size, largest first (the captures share memory)."""
        for b in reversed(self.sizes):
            self.inputs.blank(b)  # padding (length 0, slot -1): warm-up and capture write no KV
            batch = self._batch(b)
            if b in self.inputs.staged:
                work = partial(self._staged, b)
            else:
                work = self._replayed if self.prev_tokens.numel() else self.captured_work
            if self.greedy_head and b * self.query_len * self.model.config.vocab_size <= self.HEAD_MAX_ELEMENTS:
                work = partial(self._with_head, b, work)
            self._replays[b] = self.api.capture(lambda batch=batch, work=work: work(batch))
        for b in reversed(self.sizes) if self.head_graphs else ():
            if b * self.model.config.vocab_size <= self.HEAD_MAX_ELEMENTS:
                self._head_replays[b] = self.api.capture(partial(self._argmax_into_values, b))[0]
        self.inputs.reset_turn()

    HEAD_MAX_ELEMENTS = 1 << 25  # the most logits a replay's greedy head computes (64 MiB in 16 bits)

    def _with_head(self, b: int, work: Callable[[StepBatch], torch.Tensor], batch: StepBatch) -> torch.Tensor:
        hidden = work(batch)
        self._heads[b] = self._argmax(hidden)
        return hidden

    def _argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every row's argmax over the LM head's logits (the device's fused argmax where offered,
        as the sampler's)."""
        logits = self.model.compute_logits(hidden)
        fused = getattr(self.fused_ops, "argmax", None)
        return fused(logits) if fused is not None else logits.argmax(-1)

    def _argmax_into_values(self, b: int) -> torch.Tensor:
        """The head graph of size b: every row's argmax of the forward's output, into the values buffer."""
        return self.prev_tokens[:b].copy_(self._argmax(self._replays[b][1]))

    def replay_head(self, size: int) -> torch.Tensor | None:
        """After a replay of this size (``run``): its rows' argmaxes over the LM head's logits,
        written into ``prev_tokens[:size]`` by the size's head graph (whoever copies that buffer
        elsewhere must have finished first); None where this size has none (``head_graphs``)."""
        replay = self._head_replays.get(size)
        if replay is None:
            return None
        replay()
        return self.prev_tokens[:size]

    def _staged(self, b: int, batch: StepBatch) -> torch.Tensor:
        # the inputs from host memory, placeholders resolved: no copy and no launch before the replay
        self.inputs.stage(b, self.prev_tokens, self.fused_ops)
        return self.captured_work(batch)

    def _replayed(self, batch: StepBatch) -> torch.Tensor:
        # placeholders first, at every replay (a step without placeholders keeps its ids): no
        # launches of their own before the replay
        resolve_placeholders(batch.input_ids, self.prev_tokens, out=batch.input_ids, ops=self.fused_ops)
        return self.captured_work(batch)

    @property
    def fused_ops(self) -> FusedOps | None:
        """The device's fused kernels the model was given (None: plain torch)."""
        return getattr(self.model, "fused_ops", None)

    def captured_work(self, batch: StepBatch) -> torch.Tensor:
        """What a replay computes from the static inputs: one forward (a subclass may do more)."""
        meta = self.attention.build_metadata(batch)
        return self.model(batch.input_ids, batch.positions, self.kv_caches, meta)

    def size_for(self, num_seqs: int, max_seq_len: int) -> int | None:
        """The captured batch size a step of this shape replays, or None (run it eagerly).
        ``max_seq_len``: the longest sequence once this step's tokens (padding included) are in."""
        if num_seqs > self.max_batch or max_seq_len > self.max_seq_len or not self._replays:
            return None
        return next(s for s in self.sizes if s >= num_seqs)

    def run_padded(self, size: int, tokens: Sequence[Sequence[int]], starts: Sequence[int],
                   tables: Sequence[Sequence[int]], on_device: Callable[[], None] | None = None,
                   prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [size * query_len, hidden] of one step in which sequence i computes
        ``tokens[i]`` (1 to query_len of them) from position starts[i]; its rows are
        i*query_len .. i*query_len + len(tokens[i]) - 1. A sequence's length is its real tokens'
        (the padding rows see the same keys as its last real row), so attention reads exactly the
        keys, in the same tiles, as an eager step would. A negative token -(r+1) stands for row r
        of ``prev_tokens`` (on the device), as in ``run``."""
        q, bs, mb = self.query_len, self.block_size, self.max_blocks
        host = self._next_host(size)
        tab = host["tables"]
        tab[:] = 0  # (the host buffer is shared by the sizes' layouts: no stale entries)
        # the rows are laid out in Python lists and written with one conversion a field: at the
        # batch sizes graphs take, cheaper than numpy's calls per sequence (this host work is on
        # the critical path of a speculative round at batch 1)
        rows = size * q
        ids, pos, slots = [0] * rows, [0] * rows, [-1] * rows
        lens, ctx, single = [0] * size, [0] * size, [False] * size
        least = 1 if self.takes_single_runs else 2
        for i, (toks, start, blocks) in enumerate(zip(tokens, starts, tables, strict=True)):
            n = len(toks)
            if not least <= n <= q:
                raise ValueError(f"a sequence of this step has {n} tokens; these graphs take {least} to {q}")
            nb = min(len(blocks), mb)  # blocks reserved past max_seq_len are never read
            tab[i, :nb] = blocks[:nb]
            row = i * q
            ids[row:row + n] = toks
            for j in range(n):
                p = start + j
                pos[row + j] = p
                slots[row + j] = blocks[p // bs] * bs + p % bs
            pos[row + n:row + q] = [start + n - 1] * (q - n)  # padding rows repeat the last position
            lens[i] = start + n                               # (rotary stays in range)
            ctx[i] = start
            single[i] = n == 1
        host["ids"][:] = ids
        host["pos"][:] = pos
        host["slots"][:] = slots
        host["lens"][:] = lens
        if "ctx" in host:  # (not in one-token graphs' inputs)
            host["ctx"][:] = ctx
        if "single" in host:
            host["single"][:] = single
        self._check_placeholders(min(ids), prev_tokens)
        if on_device is not None:
            on_device()
        return self._upload_and_replay(size, prev_tokens)[:size * q]

    def run(self, size: int, tokens: Sequence[int], starts: Sequence[int], tables: Sequence[Sequence[int]],
            prev_tokens: torch.Tensor | None, on_device: Callable[[], None] | None = None) -> torch.Tensor:
        """Hidden states [len(tokens), hidden] of one decode step (token i at position starts[i] of
        the sequence whose blocks are tables[i]); a negative token -(r+1) stands for row r of
        ``prev_tokens`` (the previous step's samples, still on the device). ``on_device`` is called
        once the host-side work is done, just before the first device work is queued. One-token
        graphs only (query_len 1); see ``run_padded`` for more."""
        if self.query_len != 1:
            raise ValueError(f"run() replays one-token steps; these graphs take {self.query_len} tokens a "
                             "sequence (use run_padded)")
        b, bs = len(tokens), self.block_size
        self._check_placeholders(min(tokens), prev_tokens)
        host = self._next_host(size)
        ids, pos, slots, lens, tab = (host[k] for k in ("ids", "pos", "slots", "lens", "tables"))
        tab[:] = 0  # (the host buffer is shared by the sizes' layouts: no stale entries)
        ids[:b] = tokens
        ids[b:size] = 0
        pos[:b] = starts
        pos[b:size] = 0
        lens[:b] = pos[:b] + 1
        lens[b:size] = 0
        for i, blocks in enumerate(tables):
            n = min(len(blocks), self.max_blocks)  # blocks reserved past max_seq_len are never read
            tab[i, :n] = blocks[:n]
        p = pos[:b]
        slots[:b] = tab[np.arange(b), p // bs].astype(np.int64) * bs + p % bs
        slots[b:size] = -1
        if on_device is not None:
            on_device()
        return self._upload_and_replay(size, prev_tokens)[:b]

    @staticmethod
    def _check_placeholders(lowest: int, prev_tokens: torch.Tensor | None) -> None:
        """A placeholder -(r+1) needs row r of the given device tokens."""
        have = 0 if prev_tokens is None else prev_tokens.numel()
        if lowest < -have:
            raise ValueError(f"placeholder token {lowest} stands for row {-lowest - 1} of the device tokens, "
                             f"but {have} were given")

    def _next_host(self, size: int) -> dict[str, np.ndarray]:
        """The host fields of a step of this size to fill: a staged size's turn that its next
        replay reads; else the copy buffer the step before did not fill."""
        if size in self.inputs.staged:
            return self.inputs.staged_host(size)
        self._filled = self._turn
        self._turn ^= 1
        return self.inputs.host(self._filled, size)

    def _gather_values(self, size: int, prev_tokens: torch.Tensor) -> None:
        """A step whose placeholders stand for rows past the graph's buffer of values: the rows
        they name are gathered into it, and the filled ids renumbered to match."""
        ids = self.inputs.staged_host(size)["ids"] if size in self.inputs.staged \
            else self.inputs.host(self._filled, size)["ids"]
        held = ids < 0
        rows = np.unique(~ids[held])  # -(r+1) -> r
        index = torch.from_numpy(rows).pin_memory() if self.device.type != "cpu" else torch.from_numpy(rows)
        index = index.to(self.device, non_blocking=True)  # (no wait for the step in flight)
        self.prev_tokens[:rows.size].copy_(prev_tokens[index])
        ids[held] = ~np.searchsorted(rows, ~ids[held])

    def _upload_and_replay(self, size: int, prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Copy the step's inputs (filled by ``_next_host``) to the device in one copy (a staged
        size's replay reads them itself), and the placeholders' values to the graph's buffer (the
        replay resolves them first; values already there, as the runner's samples are, are not
        copied; of more values than it holds, the rows named), replay that size's graph and return
        its whole output."""
        staged = size in self.inputs.staged
        mine = self.prev_tokens
        resolve_here = prev_tokens is not None and not mine.numel()
        if prev_tokens is not None and mine.numel():  # the graph resolves them
            if prev_tokens.numel() > mine.numel():  # the rows they stand for, into the graph's buffer
                self._gather_values(size, prev_tokens)
            elif prev_tokens.data_ptr() != mine.data_ptr():
                mine[:prev_tokens.numel()].copy_(prev_tokens)
        if not staged:
            self.inputs.upload(self._filled, size)
        if resolve_here:  # graphs without a buffer of values: resolved here, before the replay
            ids = self.inputs.device(size)["ids"]
            resolve_placeholders(ids, prev_tokens, out=ids, ops=self.fused_ops)
        replay, out = self._replays[size]
        if staged:
            self.inputs.staged_replay()
        replay()
        self.last_head = self._heads.get(size)
        return out


class PrefillGraphs:
    """Steps of ONE sequence computing 2 to ``max(token_sizes)`` tokens from any position (a
    prompt, a chunk of one, the rest of a prompt after a cached prefix) replayed from graphs: one
    set a token count, each a ``DecodeGraphs`` of one sequence with that many query rows; a step of
    n tokens runs the smallest count >= n, padded at its end with rows that write no KV and whose
    outputs are ignored. What they save is the host's launch of each kernel of the forward, which
    at these sizes takes longer than the device's work (a first token's wait at low load)."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, kv_caches: list[Any],
                 graphs: DeviceGraphs, device: torch.device, block_size: int, token_sizes: Sequence[int],
                 max_seq_len: int) -> None:
        if not token_sizes or min(token_sizes) < 2:
            raise ValueError(f"prefill graph token counts must be integers of at least 2, got {list(token_sizes)}")
        self.sets = {q: DecodeGraphs(model, attention, kv_caches, graphs, device, block_size, [1], max_seq_len,
                                     query_len=q, placeholders=False, single_runs=False)
                     for q in sorted(set(token_sizes))}

    def capture(self) -> None:
        """Record every token count's forward, largest first (they share the memory pool)."""
        for q in sorted(self.sets, reverse=True):
            self.sets[q].capture()

    def graphs_for(self, num_tokens: int, seq_len: int) -> DecodeGraphs | None:
        """The graphs a step of one sequence computing ``num_tokens`` tokens, ``seq_len`` long
        once they are in, replays (None: run it eagerly)."""
        if num_tokens < 2:
            return None
        q = next((q for q in self.sets if q >= num_tokens), None)
        if q is None or self.sets[q].size_for(1, seq_len) is None:
            return None
        return self.sets[q]
