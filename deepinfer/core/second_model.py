"""A second model beside the target, for a drafter that runs one: its own attention backend and
paged KV pool, its steps run eagerly, compiled or replayed from device graphs, its rows sampled,
and rounds of k decode steps in one replay.

A step is given as feeds, one a sequence: (the token ids to compute, the position of the first,
the sequence's block table in this model's pool), as ``build_step_batch`` takes them. The caller
keeps its sequences: which tokens each has in this model's cache, and its block list, grown with
``reserve`` and given back with ``free``. Steps run in torch's inference mode.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from deepinfer.core.block_pool import Block, BlockPool
from deepinfer.core.eager_batch import build_step_batch
from deepinfer.core.graphs import DecodeGraphs
from deepinfer.core.interfaces import DeviceGraphs
from deepinfer.core.loop_graphs import DraftLoopGraphs, LoopRound, sampled_sizes
from deepinfer.core.request import Request
from deepinfer.core.sampler import sample_rows
from deepinfer.core.sampling_filters import needs_sort, sampling_rows
from deepinfer.core.step_batch import StepBatch
from deepinfer.core.verification import accept_greedy

if TYPE_CHECKING:
    from deepinfer.core.compiled_step import CompiledStep
    from deepinfer.core.context import EngineContext

#: (token ids to compute, position of the first, block table) of one sequence in a step
Feed = tuple[list[int], int, list[int]]


class SecondModel:
    """A model loaded beside the target on the engine's device, with a fresh instance of the
    engine's attention backend and a KV pool of its own (``num_blocks`` blocks of the engine's
    block size). It owns that pool and the model's steps; the caller owns its sequences."""

    CATCH_UP_CHUNKS = 4  # the most replays of the first-step graphs a catch-up takes (else one eager step)
    #: what the core's greedy verification gives from the target's argmax rows (``accept_greedy(drafts,
    #: best)``: the drafts while they equal it, then the target's token), for a round chained behind it
    accept_greedy = staticmethod(accept_greedy)

    def __init__(self, ctx: EngineContext, model_dir: str, num_blocks: int, dtype: torch.dtype | None = None) -> None:
        self.block_size = ctx.config.block_size
        self.device = ctx.device.torch_device
        self.attention = ctx.new_attention()
        self.dtype = dtype or ctx.dtype  # the model's weights and KV cache (the target's by default)
        self.model = ctx.load_model(model_dir, self.attention, self.dtype)
        layers = self.model.attention_layers()
        self.kv_caches = self.attention.allocate_kv_cache(layers, num_blocks, self.block_size, self.dtype,
                                                          self.device)
        self.pool = BlockPool(num_blocks, self.block_size)
        self.vocab_size: int = self.model.config.vocab_size
        #: the most tokens a sequence may hold (the positions its rotary tables cover)
        self.max_len: int = getattr(self.model.config, "max_position_embeddings", None) or 1 << 30
        self.graphs: DecodeGraphs | None = None
        self.first_graphs: DecodeGraphs | None = None  # a round's first step: up to max(2, loop_first) tokens
        self.loop: DraftLoopGraphs | None = None  # a greedy round's k steps in one replay
        #: a sampled round's k steps in one replay, by whether its filters sort the logits (needs_sort)
        self.sampled_loops: dict[bool, DraftLoopGraphs] = {}
        #: one-token steps of one sequence, compiled (where steps run eagerly: compile_steps)
        self.compiled: CompiledStep | None = None

    # ------------------------------------------------------------------------------------ KV pool
    def reserve(self, blocks: list[Block], num_tokens: int) -> bool:
        """Grow a sequence's block list to hold ``num_tokens`` tokens; False (nothing taken) when
        the pool has too few free blocks."""
        need = -(-num_tokens // self.block_size) - len(blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free_blocks:
            return False
        blocks.extend(self.pool.allocate(need))
        return True

    def free(self, blocks: list[Block]) -> None:
        """Give a sequence's blocks back to the pool, its tail first."""
        self.pool.free(reversed(blocks))

    # ------------------------------------------------------------------------- compiled and graphs
    def compile_steps(self) -> None:
        """Compile the one-token steps of one sequence with torch.compile (for a device whose steps
        run eagerly, the CPU: ``deepinfer/core/compiled_step.py``), where the attention backend
        builds one sequence's metadata; without a working compiler they stay eager."""
        from deepinfer.core.compiled_step import CompiledStep  # (imports torch's compiler: only here)

        if CompiledStep.supported(self.attention):
            self.compiled = CompiledStep(self.model, self.attention, self.kv_caches, self.block_size, self.device)
            self.compiled.warm_up(self.pool)

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: Sequence[int], max_seq_len: int,
                      loop_steps: int = 0, loop_first: int = 2, sampled_loop: bool = False) -> None:
        """Replay the model's steps from graphs captured for these batch sizes: one-token steps
        and steps of up to ``max(2, loop_first)`` tokens a sequence (a round's first: a longer
        catch-up replays them in chunks). Steps they do not cover run eagerly. With ``loop_steps``
        (k), rounds that take every step's argmax replay all k steps from one graph
        (``DraftLoopGraphs``; ``run_loop``), whose first step takes up to ``loop_first`` new tokens
        a sequence; with ``sampled_loop`` too, so do rounds that draw sampled rows (two more sets:
        with filters that sort the logits, and without)."""
        if not self.attention.supports_graphs:
            raise ValueError(f"the attention plugin {self.attention.name!r} cannot run in device graphs; "
                             "the draft model runs eagerly with it (do not enable graphs)")
        one, first = (DecodeGraphs(self.model, self.attention, self.kv_caches, graphs, self.device, self.block_size,
                                   batch_sizes, max_seq_len, query_len=q, placeholders=False)
                      for q in (1, max(2, loop_first)))
        one.capture()
        first.capture()
        self.graphs, self.first_graphs = one, first
        if loop_steps > 0:
            self.loop = DraftLoopGraphs(one, loop_steps, loop_first)
            self.loop.capture()
            # (on the CPU and CUDA devices only, where the sampler's float64 sums and searches were
            # tested: sampler.batch_device); the two sets write their distributions into one buffer
            sizes = sampled_sizes(one) if sampled_loop and self.device.type in ("cpu", "cuda") else []
            q_out = torch.empty(max(sizes), loop_steps, self.vocab_size, device=self.device) if sizes else None
            for sort in (False, True) if sizes else ():
                self.sampled_loops[sort] = DraftLoopGraphs(one, loop_steps, loop_first, sampled=sort, q_out=q_out)
                self.sampled_loops[sort].capture()

    @property
    def loop_steps(self) -> int:
        """The steps of a round ``run_loop`` replays (0: no loop graph)."""
        return 0 if self.loop is None else self.loop.steps

    # -------------------------------------------------------------------------------------- steps
    @torch.inference_mode()
    def step(self, feeds: list[Feed], argmax: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One step over the feeds: (the float32 logits [n, V] of each feed's last token, and with
        ``argmax`` each row's top probability and its token). A step of one sequence the compiled
        step covers runs compiled (where no graphs are enabled), and gives both anyway."""
        c = self.compiled
        fast = c.run(feeds) if c is not None and self.graphs is None and c.covers(feeds) else None
        if fast is not None:
            best_p, best, logits = fast
            return logits, best_p, best
        logits = self.last_logits(feeds)
        if not argmax:
            return logits, None, None
        best_p, best = logits.softmax(-1).max(-1)
        return logits, best_p, best

    @torch.inference_mode()
    def last_logits(self, feeds: list[Feed]) -> torch.Tensor:
        """Logits (float32) of each feed's last token, after computing the feeds' tokens: from the
        graphs where they cover the step (a longer feed caught up first: ``_catch_up``), else eagerly."""
        end = max(start + len(t) for t, start, _ in feeds)
        if self.graphs is not None and self.first_graphs.size_for(len(feeds), end) is not None:
            feeds = self._catch_up(feeds, self.first_graphs.query_len)
            longest = max(len(t) for t, _, _ in feeds)
            g = self.graphs if longest == 1 else self.first_graphs
            size = g.size_for(len(feeds), end)
            if size is not None:
                tokens, starts, tables = zip(*feeds, strict=True)
                if longest == 1:
                    hidden = g.run(size, [t[0] for t in tokens], starts, tables, prev_tokens=None)
                else:  # sequence i's rows are q i to q i + q - 1
                    hidden = g.run_padded(size, tokens, starts, tables)
                    hidden = hidden[[g.query_len * i + len(t) - 1 for i, t in enumerate(tokens)]]
                return self.model.compute_logits(hidden).float()
        hidden, batch = self._eager(feeds)
        last = batch.query_start_loc[1:].long() - 1
        return self.model.compute_logits(hidden[last]).float()

    def _eager(self, feeds: list[Feed]) -> tuple[torch.Tensor, StepBatch]:
        """(hidden states, the step's batch) of one eager forward over the feeds' tokens."""
        batch = build_step_batch(feeds, self.block_size, self.device)
        return self.model(batch.input_ids, batch.positions, self.kv_caches, self.attention.build_metadata(batch)), batch

    def _catch_up(self, feeds: list[Feed], q: int) -> list[Feed]:
        """Computes the KV of each feed's tokens but its last ones (at most ``q``); returns what is
        left to feed. In chunks of q tokens a sequence from the first-step graphs (a few rounds'
        tokens the model did not compute), or where they do not cover it or it would take over
        ``CATCH_UP_CHUNKS`` replays (after a prompt), all but the last q eagerly. The graphs' inputs
        fill two host buffers in turn, and a replay's copy may still be queued behind the one before:
        the host waits for the replay that last read a buffer before it fills it again."""
        longest = max(len(t) for t, _, _ in feeds)
        chunked = longest <= q * (self.CATCH_UP_CHUNKS + 1)
        done: list[torch.Event] = []  # after each chunk's replay (on a device that queues work)
        g = self.first_graphs
        while longest > q:
            for e in done[-2:-1]:  # (the replay before last)
                e.synchronize()
            long = [(t, start, blocks) for t, start, blocks in feeds if len(t) > q]
            size = None if g is None or not chunked else g.size_for(len(long), max(s + q for _, s, _ in long))
            if size is None:  # all but the last q in one step
                self._eager([(t[:-q], start, blocks) for t, start, blocks in long])
                feeds = [(t[-q:], start + len(t) - q, blocks) if len(t) > q else (t, start, blocks)
                         for t, start, blocks in feeds]
                break
            tokens, starts, tables = zip(*((t[:q], start, blocks) for t, start, blocks in long), strict=True)
            g.run_padded(size, tokens, starts, tables)
            if self.device.type != "cpu":
                done.append(torch.Event(self.device))
                done[-1].record()
            feeds = [(t[q:], start + q, blocks) if len(t) > q else (t, start, blocks) for t, start, blocks in feeds]
            longest -= q
        for e in done[-2:-1]:
            e.synchronize()
        return feeds

    @staticmethod
    def sample(logits: torch.Tensor, requests: Sequence[Request],
               generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [n], row i drawn from request i's sampling distribution (its temperature and
        filters) with one uniform number of ``generators[i]``, and those distributions [n, V],
        where the logits are (the rejection sampler reads them as a draft's ``probs``)."""
        uniforms = [float(torch.rand(1, generator=g, dtype=torch.float64)) for g in generators]
        return sample_rows(logits, requests, uniforms)

    # -------------------------------------------------------------------------------- loop rounds
    def _loop_for(self, requests: Sequence[Request] | None) -> tuple[DraftLoopGraphs | None, np.ndarray | None]:
        """The loop graphs that run a round of these requests (None: every row takes its argmax,
        the greedy one; else the sampled set their filters need, if captured) and, for a sampled
        set, the requests' ``sampling_rows``."""
        if requests is None:
            return self.loop, None
        if not self.sampled_loops:
            return None, None
        rows = sampling_rows(requests, self.vocab_size)
        return self.sampled_loops[needs_sort(rows, self.vocab_size)], rows

    def loop_size(self, num_seqs: int, longest: int, k: int, requests: Sequence[Request] | None = None) -> int | None:
        """The loop graph's size for a round of k steps over sequences of at most ``longest``
        tokens (``requests`` as ``run_loop``'s), or None where no loop graph takes the round."""
        loop = self._loop_for(requests)[0]
        return None if loop is None or loop.steps != k else loop.size_for(num_seqs, longest + k - 1)

    @torch.inference_mode()
    def run_loop(self, feeds: list[Feed], k: int, requests: Sequence[Request] | None = None,
                 generators: Sequence[torch.Generator] | None = None, lazy: bool = False) -> LoopRound | None:
        """A round of k steps for every feed from one loop graph, each step's token the next
        step's input: ``requests`` None, every row's argmax (the greedy loop graph); else feed i's
        request samples its row (greedy requests take the argmax) with k uniform numbers of
        ``generators[i]``, the k a round step by step would draw (the sampled loop graphs). A feed
        with more new tokens than the loop's first step takes is caught up first. The round
        (``LoopRound``) holds every step's token and its confidence (a drawn token's: its
        distribution's top probability, not its own, which would tell a rule choosing what to
        verify about its value), a sampled round's distributions (``q``), and with ``lazy`` its
        tokens as device tokens (``source``, for ``DraftProposal.source``). None where no loop
        graph covers the round (a batch or a length beyond the captured ones)."""
        loop, rows = self._loop_for(requests)
        longest = max(start + len(t) for t, start, _ in feeds)
        if loop is None or loop.steps != k or (size := loop.size_for(len(feeds), longest + k - 1)) is None:
            return None
        feeds = self._catch_up(feeds, loop.query_len)
        tokens, starts, tables = zip(*feeds, strict=True)
        if rows is None:
            return LoopRound(loop.run_padded(size, tokens, starts, tables)[:len(feeds)], lazy)
        uniforms = np.zeros((len(feeds), k))
        for i, (req, gen) in enumerate(zip(requests, generators, strict=True)):
            if not req.params.greedy:
                uniforms[i] = torch.rand(k, generator=gen, dtype=torch.float64).numpy()
        out, q = loop.run_sampled(size, tokens, starts, tables, rows, uniforms)
        return LoopRound(out[:len(feeds)], lazy, q)

    @torch.inference_mode()
    def run_chained(self, size: int, best: torch.Tensor, drafts: torch.Tensor, bases: Sequence[int],
                    vstarts: Sequence[int], dstarts: Sequence[int], tables: Sequence[Sequence[int]]) -> LoopRound:
        """The greedy round after a verification, queued before the host has read it: ``best``
        holds the target's argmax of each verified row and ``drafts`` the verified round's tokens
        (its ``source.tokens``), both on the device; the loop graph (of ``size``, from
        ``loop_size``) counts the accepted drafts itself. Sequence i had ``bases[i]`` tokens before
        the verified ones, its target tokens start at row ``vstarts[i]`` of ``best`` and its drafts
        at ``dstarts[i]`` of ``drafts`` (``DraftLoopGraphs.run_chained``). A round with its tokens
        left on the device."""
        out = self.loop.run_chained(size, best, drafts, bases, vstarts, dstarts, tables)[:len(bases)]
        return LoopRound(out, lazy=True)
