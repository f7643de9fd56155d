"""A small model with its own paged KV cache, run inside the engine to draft tokens."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from deepinfer.plugins import (
    Block,
    BlockPool,
    DecodeGraphs,
    DeviceGraphs,
    DeviceTokens,
    EngineContext,
    HostCopy,
    Request,
    build_step_batch,
    filter_logits,
)
from deepinfer_builtin.draft_compile import CompiledGreedyStep


class _RoundOnDevice:
    """A loop round's output [n, 2, k] (each step's token and its probability), copied to the
    host behind the round's device work; read (waiting for the copy) only when needed."""

    def __init__(self, out: torch.Tensor) -> None:
        self.copy = HostCopy(out)
        self._lists: list | None = None

    def lists(self) -> list:
        """[tokens, probabilities], each [n][k] (tokens as floats: exact below 2^24)."""
        if self._lists is None:
            self._lists = self.copy.wait().transpose(0, 1).tolist()
        return self._lists

    def tokens(self, i: int) -> list[int]:
        return [int(t) for t in self.lists()[0][i]]

    def all_tokens(self) -> list[int]:
        return [int(t) for row in self.lists()[0] for t in row]


@dataclass(slots=True)
class _DraftSeq:
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in the draft cache
    committed: int = 0  # the request's length at the last proposal: history before it is shared
    blocks: list[Block] = field(default_factory=list)
    generator: torch.Generator | None = None
    #: a round whose drafts are still on their way to the host, and this sequence's row: their
    #: KV (all but the last's) is in the draft cache, their values join ``tokens`` when read
    pending: tuple[_RoundOnDevice, int] | None = None

    def settle(self) -> None:
        if self.pending is not None:
            rnd, i = self.pending
            self.pending = None
            self.tokens.extend(rnd.tokens(i)[:-1])


class DraftLoopGraphs(DecodeGraphs):
    """A greedy round's k draft steps in one replay. The first step computes each sequence's new
    tokens, one to ``first`` of them (2 by default: the target's token, behind the last accepted
    draft when all were accepted; more where rounds may follow a lookup's), laid out as in the
    verification graphs (``run_padded``); then each step's argmax becomes the next step's one
    token, on the device. The later steps' positions, slots and lengths follow from the first's,
    so the host writes them for all k - 1 steps with the round's inputs (padding rows stay at
    slot -1 and length 0: they write nothing). The output holds every step's token and
    probability, [size, 2, k] (float32: token ids below 2^24 are exact): one launch and one copy
    to the host a round, instead of k launches each waiting for its token."""

    def __init__(self, one: DecodeGraphs, steps: int, first: int = 2) -> None:
        self.steps = steps  # (before the base class lays out its inputs, which hold the later steps' too)
        super().__init__(one.model, one.attention, one.kv_caches, one.api, one.device, one.block_size, one.sizes,
                         one.max_seq_len, query_len=first, placeholders=False)
        self.one = one  # the later steps run the one-token graphs' forward on the inputs below

    def _fields(self):
        later = self.steps - 1
        return {**super()._fields(), "step_pos": (torch.long, lambda b: (later, b)),
                "step_slots": (torch.long, lambda b: (later, b)), "step_lens": (torch.int32, lambda b: (later, b))}

    def run_padded(self, size, tokens, starts, tables, on_device=None, prev_tokens=None) -> torch.Tensor:
        host = self.inputs.host(self._turn, size)  # the buffer the base class's run_padded fills next
        later, bs = self.steps - 1, self.block_size
        pos, slots, lens = [0] * (later * size), [-1] * (later * size), [0] * (later * size)  # [later, size]
        for i, (toks, start, blocks) in enumerate(zip(tokens, starts, tables, strict=True)):
            for j in range(later):  # step j + 1's one token sits j + 1 places after the first step's last
                p = start + len(toks) + j
                pos[j * size + i], lens[j * size + i], slots[j * size + i] = p, p + 1, blocks[p // bs] * bs + p % bs
        for name, values in (("step_pos", pos), ("step_slots", slots), ("step_lens", lens)):
            host[name].reshape(-1)[:] = values
        return super().run_padded(size, tokens, starts, tables, on_device=on_device, prev_tokens=prev_tokens)

    def captured_work(self, batch) -> torch.Tensor:
        b = batch.seq_lens.shape[0]
        new = batch.seq_lens - batch.context_lens  # 1 to query_len new tokens; 0 for padding
        last = torch.arange(b, device=new.device) * self.query_len + (new.long() - 1).clamp(min=0)
        p, t = self._argmax(super().captured_work(batch)[last])
        tokens, probs = [t], [p]
        one, ins = self.one._batch(b), self.inputs.device(b)
        for j in range(self.steps - 1):
            step = replace(one, input_ids=tokens[-1], positions=ins["step_pos"][j],
                           slot_mapping=ins["step_slots"][j], seq_lens=ins["step_lens"][j],
                           block_tables=batch.block_tables)
            p, t = self._argmax(self.one.captured_work(step))
            tokens.append(t)
            probs.append(p)
        return torch.stack((torch.stack(tokens, 1).float(), torch.stack(probs, 1)), dim=1)

    def _argmax(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's greedy token and its probability (the draft's confidence): one fused kernel
        where the device offers it, else softmax and max."""
        logits = self.model.compute_logits(hidden)
        fused = getattr(self.fused_ops, "argmax_prob", None)
        return fused(logits) if fused is not None else logits.float().softmax(-1).max(-1)


class Draft:
    """One request's drafts. ``tokens`` are placeholders for ``source`` (see ``DeviceTokens``)
    when the round left them on the device; ``confidence`` (the draft's probability of each token
    it proposed) is then read from the host copy when first asked for."""

    __slots__ = ("_confidence", "probs", "source", "tokens")

    def __init__(self, tokens: list[int], probs: torch.Tensor | None,
                 confidence: list[float] | Callable[[], list[float]], source: DeviceTokens | None = None) -> None:
        self.tokens = tokens
        self.probs = probs  # [k, vocab] draft distributions (None: greedy, deterministic)
        self._confidence = confidence
        self.source = source

    @property
    def confidence(self) -> list[float]:
        if callable(self._confidence):
            self._confidence = self._confidence()
        return self._confidence


class DraftRunner:
    """Keeps one draft sequence per request, catches it up with the request's accepted tokens,
    then decodes k tokens for all requests together."""

    CATCH_UP_CHUNKS = 4  # the most replays of the first-step graphs a catch-up takes (else one eager step)

    def __init__(self, ctx: EngineContext, model_dir: str, num_blocks: int, dtype: torch.dtype | None = None,
                 compile_steps: bool = False) -> None:
        self.block_size = ctx.config.block_size
        self.device = ctx.device.torch_device
        self.attention = ctx.new_attention()
        self.dtype = dtype or ctx.dtype  # the draft's weights and KV cache (the target's by default)
        self.model = ctx.load_model(model_dir, self.attention, self.dtype)
        layers = self.model.attention_layers()
        self.kv_caches = self.attention.allocate_kv_cache(layers, num_blocks, self.block_size, self.dtype,
                                                          self.device)
        self.pool = BlockPool(num_blocks, self.block_size)
        self.seqs: dict[str, _DraftSeq] = {}
        self.vocab_size = self.model.config.vocab_size
        self.graphs: DecodeGraphs | None = None
        self.first_graphs: DecodeGraphs | None = None  # a round's first step: up to max(2, loop_first) tokens
        self.loop: DraftLoopGraphs | None = None  # a greedy round's k steps in one replay
        target_vocab = ctx.model_config.get("vocab_size")
        if target_vocab is not None and target_vocab != self.vocab_size:
            raise ValueError(f"the draft model {model_dir!r} has vocabulary {self.vocab_size}, the target "
                             f"{target_vocab}: a draft must share the target's tokenizer")
        #: greedy one-token steps of one sequence, compiled (where steps run eagerly: draft_compile.py)
        self.compiled: CompiledGreedyStep | None = None
        if compile_steps and CompiledGreedyStep.supported(self.attention):
            self.compiled = CompiledGreedyStep(self.model, self.attention, self.kv_caches, self.block_size,
                                               self.device)
            self.compiled.warm_up(self.pool)

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: list[int], max_seq_len: int,
                      loop_steps: int = 0, loop_first: int = 2) -> None:
        """Replay the draft's steps from graphs captured for these batch sizes: one-token steps
        (every draft step after a round's first) and steps of up to ``max(2, loop_first)`` tokens a
        sequence (a round's first: the target's token, behind the last accepted draft when all
        were accepted, or more after rounds the draft did not draft; a longer catch-up replays them
        in chunks). Steps they do not cover run eagerly. With ``loop_steps`` (k), rounds that draft
        greedily to the end replay all their steps from one graph (``DraftLoopGraphs``), whose
        first step takes up to ``loop_first`` new tokens a sequence."""
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

    def _seq(self, req: Request) -> _DraftSeq:
        seq = self.seqs.get(req.request_id)
        if seq is None:
            gen = torch.Generator().manual_seed(req.params.seed if req.params.seed is not None
                                                else hash(req.request_id) & 0x7FFFFFFF)
            seq = self.seqs[req.request_id] = _DraftSeq(generator=gen)
        return seq

    def _reserve(self, seq: _DraftSeq, num_tokens: int) -> bool:
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
        need neither the tokens nor their confidences before the verification."""
        live: list[tuple[Request, _DraftSeq]] = []
        feeds = []
        for req in requests:
            seq = self._seq(req)
            seq.settle()
            target = req.all_token_ids
            valid = _common_prefix(seq.tokens, target, seq.committed)
            seq.committed = len(target)
            valid = min(valid, len(target) - 1)  # always feed at least the last token
            if not self._reserve(seq, len(target) + k):
                self.release(req.request_id)
                continue
            del seq.tokens[valid:]
            feeds.append((target[valid:], valid, [b.block_id for b in seq.blocks]))
            seq.tokens.extend(target[valid:])
            live.append((req, seq))
        if not live:
            return {}
        if (whole_rounds or (go_on is None and another_step is None)) and all(r.params.greedy for r, _ in live):
            drafts = self._propose_in_loop(live, feeds, k, lazy)
            if drafts is not None:
                return drafts
        drafted: list[list[int]] = [[] for _ in live]
        probs: list[list[torch.Tensor]] = [[] for _ in live]
        conf: list[list[float]] = [[] for _ in live]
        active = list(range(len(live)))  # rows of live still drafting, in feed order
        for step in range(k):
            c = self.compiled
            fast = (c.run(feeds) if c is not None and self.graphs is None and c.covers(feeds)
                    and live[active[0]][0].params.greedy else None)
            if fast is not None:
                best_p, best = fast
            else:
                logits = self._forward_last(feeds)
                # greedy rows need only the argmax and its probability: one batched softmax for all
                best_p, best = logits.softmax(-1).max(-1)
            # one copy to the host (float32 holds token ids exactly: vocabularies are below 2^24)
            best_p, best = torch.stack((best_p, best.float())).tolist()
            best = [int(t) for t in best]
            still = []
            for row, i in enumerate(active):
                req, seq = live[i]
                if req.params.greedy:
                    token, confidence = best[row], best_p[row]
                else:
                    token, q = self._sample(logits[row], req, seq)
                    confidence = float(q[token])
                    probs[i].append(q)
                drafted[i].append(token)
                conf[i].append(confidence)
                if step < k - 1 and (go_on is None or go_on(req, conf[i])):
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
            stacked = None if req.params.greedy else torch.stack(probs[i])
            out[req.request_id] = Draft(drafted[i], stacked, conf[i])
        return out

    def _propose_in_loop(self, live: list[tuple[Request, _DraftSeq]], feeds, k: int,
                         lazy: bool) -> dict[str, Draft] | None:
        """Greedy rounds of k drafts for every request from the loop graph, with one copy to the
        host (waited for here, or with ``lazy`` when first read). A sequence with more new tokens
        than the loop's first step takes (after its prompt, or rounds it did not draft) first
        computes the others (``_catch_up``). None when it does not cover the round (a batch or a
        length beyond the captured ones)."""
        if (size := self.loop_size(len(feeds), max(start + len(t) for t, start, _ in feeds), k)) is None:
            return None
        feeds = self._catch_up(feeds, self.loop.query_len)
        tokens, starts, tables = zip(*feeds, strict=True)
        result = self.loop.run_padded(size, tokens, starts, tables)[:len(feeds)]
        rnd = _RoundOnDevice(result)
        source = DeviceTokens(result[:, 0].reshape(-1).long(), rnd.all_tokens) if lazy else None
        out = {}
        for i, (req, seq) in enumerate(live):
            seq.pending = (rnd, i)  # the loop computed the KV of all but the last
            if source is None:
                seq.settle()
                out[req.request_id] = Draft(rnd.tokens(i), None, rnd.lists()[1][i])
            else:
                out[req.request_id] = Draft([-(i * k + j + 1) for j in range(k)], None,
                                            lambda i=i: rnd.lists()[1][i], source)
        return out

    def loop_size(self, num_seqs: int, longest: int, k: int) -> int | None:
        """The loop graph's size for a greedy round of k drafts over sequences of at most ``longest``
        tokens, or None where it does not take the round."""
        return None if self.loop is None or self.loop.steps != k else self.loop.size_for(num_seqs, longest + k - 1)

    def _sample(self, logits: torch.Tensor, req: Request, seq: _DraftSeq) -> tuple[int, torch.Tensor]:
        """A draft token drawn from the request's sampling distribution, and that distribution."""
        p = req.params
        q = filter_logits(logits / p.temperature, p.effective_top_k, p.top_p, p.min_p).softmax(-1).cpu()
        noise = torch.empty_like(q).exponential_(generator=seq.generator)
        return int((q / noise).argmax()), q


def _common_prefix(a: list[int], b: list[int], known: int) -> int:
    """Length of the common prefix, given that the first ``known`` tokens agree."""
    n = min(len(a), len(b))
    i = min(known, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i
