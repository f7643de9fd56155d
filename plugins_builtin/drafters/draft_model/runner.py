"""A small model with its own paged KV cache, run inside the engine to draft tokens."""
from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer.plugins import (
    BlockPool,
    DecodeGraphs,
    DeviceGraphs,
    EngineContext,
    Request,
    build_step_batch,
    sample_rows,
)
from deepinfer_builtin.drafters.draft_model.compile import CompiledDraftStep
from deepinfer_builtin.drafters.draft_model.loop import ChainedRound, DraftLoopGraphs, sampled_sizes
from deepinfer_builtin.drafters.draft_model.rounds import LoopRounds
from deepinfer_builtin.drafters.draft_model.seq import Draft, DraftSeq, common_prefix, draft_seed


class DraftRunner(LoopRounds):
    """Keeps one draft sequence per request, catches it up with the request's accepted tokens,
    then decodes k tokens for all requests together."""

    CATCH_UP_CHUNKS = 4  # the most replays of the first-step graphs a catch-up takes (else one eager step)

    def __init__(self, ctx: EngineContext, model_dir: str, num_blocks: int, dtype: torch.dtype | None = None,
                 compile_steps: bool = False, greedy_sampled: bool = False) -> None:
        #: sampled requests are drafted as greedy ones are (their drafts deterministic: the draft's
        #: argmax), rounds of them replaying the loop graph too; else drawn from their distributions
        self.greedy_sampled = greedy_sampled
        self.block_size = ctx.config.block_size
        self.device = ctx.device.torch_device
        self.attention = ctx.new_attention()
        self.dtype = dtype or ctx.dtype  # the draft's weights and KV cache (the target's by default)
        self.model = ctx.load_model(model_dir, self.attention, self.dtype)
        layers = self.model.attention_layers()
        self.kv_caches = self.attention.allocate_kv_cache(layers, num_blocks, self.block_size, self.dtype,
                                                          self.device)
        self.pool = BlockPool(num_blocks, self.block_size)
        self.seqs: dict[str, DraftSeq] = {}
        self.vocab_size = self.model.config.vocab_size
        #: the most tokens a draft sequence may hold (the positions its rotary tables cover)
        self.max_len = getattr(self.model.config, "max_position_embeddings", None) or 1 << 30
        self.seed = ctx.config.seed  # (unseeded requests' draft generators derive from it)
        self.graphs: DecodeGraphs | None = None
        self.first_graphs: DecodeGraphs | None = None  # a round's first step: up to max(2, loop_first) tokens
        self.loop: DraftLoopGraphs | None = None  # a greedy round's k steps in one replay
        #: a sampled round's k steps in one replay, by whether its filters sort the logits (needs_sort)
        self.sampled_loops: dict[bool, DraftLoopGraphs] = {}
        self.chained: ChainedRound | None = None  # a round queued behind a verification (chain)
        target_vocab = ctx.model_config.get("vocab_size")
        if target_vocab is not None and target_vocab != self.vocab_size:
            raise ValueError(f"the draft model {model_dir!r} has vocabulary {self.vocab_size}, the target "
                             f"{target_vocab}: a draft must share the target's tokenizer")
        #: one-token steps of one sequence, compiled (where steps run eagerly: draft_compile.py)
        self.compiled: CompiledDraftStep | None = None
        if compile_steps and CompiledDraftStep.supported(self.attention):
            self.compiled = CompiledDraftStep(self.model, self.attention, self.kv_caches, self.block_size,
                                              self.device)
            self.compiled.warm_up(self.pool)

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: list[int], max_seq_len: int,
                      loop_steps: int = 0, loop_first: int = 2, sampled_loop: bool = False) -> None:
        """Replay the draft's steps from graphs captured for these batch sizes: one-token steps
        (every draft step after a round's first) and steps of up to ``max(2, loop_first)`` tokens a
        sequence (a round's first: the target's token, behind the last accepted draft when all
        were accepted, or more after rounds the draft did not draft; a longer catch-up replays them
        in chunks). Steps they do not cover run eagerly. With ``loop_steps`` (k), rounds that draft
        greedily to the end replay all their steps from one graph (``DraftLoopGraphs``), whose
        first step takes up to ``loop_first`` new tokens a sequence; with ``sampled_loop`` too, so
        do rounds with sampled requests (two more sets: with filters that sort the logits, and
        without)."""
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

    def _forward_last(self, feeds: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
        """Logits (float32) of each feed's last token, after computing the feeds' tokens."""
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

    def _eager(self, feeds: list[tuple[list[int], int, list[int]]]):
        """(hidden states, the step's batch) of one eager forward over the feeds' tokens."""
        batch = build_step_batch(feeds, self.block_size, self.device)
        return self.model(batch.input_ids, batch.positions, self.kv_caches, self.attention.build_metadata(batch)), batch

    def _catch_up(self, feeds: list[tuple[list[int], int, list[int]]], q: int) -> list[tuple[list[int], int, list[int]]]:
        """Computes the KV of each feed's tokens but its last ones (at most ``q``); returns what is
        left to feed. In chunks of q tokens a sequence from the first-step graphs (a few rounds'
        tokens the draft did not draft), or where they do not cover it or it would take over
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

    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.pool.free(reversed(seq.blocks))

    def _seq(self, req: Request) -> DraftSeq:
        seq = self.seqs.get(req.request_id)
        if seq is None:
            gen = torch.Generator().manual_seed(draft_seed(req, self.seed))
            seq = self.seqs[req.request_id] = DraftSeq(generator=gen)
        return seq

    def room(self, req: Request, k: int, n: int | None = None) -> int:
        """How many of k drafts the request may have at n tokens (by default its length now): the
        engine verifies at most as many as leave room for the token after them within its
        ``max_model_len``, and the draft's own positions end at ``max_len`` (drafting j tokens
        computes positions up to n + j - 2)."""
        n = len(req.all_token_ids) if n is None else n
        return max(0, min(k, req.max_model_len - n - 1, self.max_len - n + 1))

    def _reserve(self, seq: DraftSeq, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free_blocks:
            return False
        seq.blocks.extend(self.pool.allocate(need))
        return True

    @torch.inference_mode()
    def propose(self, requests: list[Request], k: int,
                go_on: Callable[[Request, list[float]], bool] | None = None,
                another_step: Callable[[int, list[list[float]], list[int]], bool] | None = None,
                whole_rounds: bool = False, lazy: bool = False) -> dict[str, Draft]:
        """Up to k draft tokens per request; after each, ``go_on(request, confidences so far)``
        may end a request's drafting early (its later drafts would be of no use), and
        ``another_step(steps done, every request's confidences, indices of those that would go
        on)`` may end the whole round (another draft step would not pay for itself). Rounds the
        loop graph takes draft all k: those with neither callback, and with ``whole_rounds`` any
        (the callbacks then serve only the rounds it does not take). With ``lazy``, a round the
        loop graph takes leaves its drafts on the device (``Draft.source``): for callers that
        need neither the tokens nor their confidences before the verification.

        A draft's confidence is the top probability of the distribution it came from: a greedy
        draft's own probability, but not a drawn draft's. Its own would tell a rule that chooses
        which drafts to verify (deepspark) about its value, and verifying a drawn draft depending
        on its value biases the rejection sampler's output away from the target's distribution;
        the top probability depends only on the tokens before it."""
        chained, self.chained = self.chained, None
        if (chained is not None and (whole_rounds or (go_on is None and another_step is None))
                and all(r.params.greedy for r in requests)
                and (drafts := self._take_chained(chained, requests, k, lazy)) is not None):
            return drafts
        live: list[tuple[Request, DraftSeq]] = []
        feeds, caps = [], []
        for req in requests:
            if (cap := self.room(req, k)) == 0:  # (at the end of its context: no drafts)
                continue
            seq = self._seq(req)
            seq.settle()
            target = req.all_token_ids
            valid = common_prefix(seq.tokens, target, seq.committed)
            seq.committed = len(target)
            valid = min(valid, len(target) - 1)  # always feed at least the last token
            if not self._reserve(seq, len(target) + cap):
                self.release(req.request_id)
                continue
            del seq.tokens[valid:]
            feeds.append((target[valid:], valid, [b.block_id for b in seq.blocks]))
            seq.tokens.extend(target[valid:])
            live.append((req, seq))
            caps.append(cap)
        if not live:
            return {}
        # a loop round drafts all k for everyone: rounds with a request near its end step by step
        if (whole_rounds or (go_on is None and another_step is None)) and min(caps) == k:
            drafts = self._propose_in_loop(live, feeds, k, lazy)
            if drafts is not None:
                return drafts
        drafted: list[list[int]] = [[] for _ in live]
        probs: list[list[torch.Tensor]] = [[] for _ in live]
        conf: list[list[float]] = [[] for _ in live]
        active = list(range(len(live)))  # rows of live still drafting, in feed order
        for step in range(k):
            c = self.compiled
            fast = c.run(feeds) if c is not None and self.graphs is None and c.covers(feeds) else None
            sampled = [row for row, i in enumerate(active) if not self.drafts_greedily(live[i][0])]
            if fast is not None:
                best_p, best, logits = fast
            else:
                logits = self._forward_last(feeds)
                if len(sampled) < len(active):  # greedy rows need only the argmax and its probability
                    best_p, best = logits.softmax(-1).max(-1)
            if sampled:  # drawn together, their distributions kept where the logits are (for verify_batch)
                tokens, q = self._sample([live[active[row]] for row in sampled],
                                         logits if len(sampled) == len(active) else logits[sampled])
                picked = q.amax(-1)  # (a drawn draft's confidence: see the docstring)
                if len(sampled) == len(active):
                    best_p, best = picked, tokens
                else:
                    where = torch.tensor(sampled, device=best.device)
                    best_p, best = best_p.index_put((where,), picked.to(best_p.device)), \
                        best.index_put((where,), tokens.to(best.device))
                for row, q_row in zip(sampled, q, strict=True):
                    probs[active[row]].append(q_row)
            # one copy to the host (float32 holds token ids exactly: vocabularies are below 2^24)
            best_p, best = torch.stack((best_p.float(), best.float())).tolist()
            best = [int(t) for t in best]
            still = []
            for row, i in enumerate(active):
                req = live[i][0]
                drafted[i].append(best[row])
                conf[i].append(best_p[row])
                if step < caps[i] - 1 and (go_on is None or go_on(req, conf[i])):
                    still.append(i)
            if still and another_step is not None and not another_step(step + 1, conf, still):
                still = []
            feeds = []
            for i in still:  # the next step computes each one's latest draft
                seq = live[i][1]
                feeds.append(([drafted[i][-1]], len(seq.tokens), [b.block_id for b in seq.blocks]))
                seq.tokens.append(drafted[i][-1])
            active = still
            if not active:
                break
        out = {}
        for i, (req, _) in enumerate(live):
            stacked = torch.stack(probs[i]) if probs[i] else None
            out[req.request_id] = Draft(drafted[i], stacked, conf[i])
        return out

    @staticmethod
    def _sample(rows: list[tuple[Request, DraftSeq]], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens [n] for sampled requests, each drawn from its request's sampling
        distribution with the sequence's generator, and those distributions [n, vocab]."""
        uniforms = [float(torch.rand(1, generator=seq.generator, dtype=torch.float64)) for _, seq in rows]
        return sample_rows(logits, [req for req, _ in rows], uniforms)

