"""A small model with its own paged KV cache, run inside the engine to draft tokens."""
from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer.plugins import EngineContext, Request, SecondModel
from deepinfer.plugins.capabilities import DeviceGraphs
from deepinfer_builtin.drafters.draft_model.rounds import ChainedRound, LoopRounds
from deepinfer_builtin.drafters.draft_model.seq import Draft, DraftSeq, common_prefix, draft_seed


class DraftRunner(LoopRounds):
    """Keeps one draft sequence per request, catches it up with the request's accepted tokens,
    then decodes k tokens for all requests together."""

    def __init__(self, ctx: EngineContext, model_dir: str, num_blocks: int, dtype: torch.dtype | None = None,
                 compile_steps: bool = False, greedy_sampled: bool = False) -> None:
        #: sampled requests are drafted as greedy ones are (their drafts deterministic: the draft's
        #: argmax), rounds of them replaying the loop graph too; else drawn from their distributions
        self.greedy_sampled = greedy_sampled
        self.draft = SecondModel(ctx, model_dir, num_blocks, dtype)  # the model, its KV pool and graphs
        self.seqs: dict[str, DraftSeq] = {}
        self.seed = ctx.config.seed  # (unseeded requests' draft generators derive from it)
        self.chained: ChainedRound | None = None  # a round queued behind a verification (chain)
        target_vocab = ctx.model_config.get("vocab_size")
        if target_vocab is not None and target_vocab != self.draft.vocab_size:
            raise ValueError(f"the draft model {model_dir!r} has vocabulary {self.draft.vocab_size}, the target "
                             f"{target_vocab}: a draft must share the target's tokenizer")
        if compile_steps:  # one-token steps of one sequence, compiled (where steps run eagerly)
            self.draft.compile_steps()

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: list[int], max_seq_len: int,
                      loop_steps: int = 0, loop_first: int = 2, sampled_loop: bool = False) -> None:
        """Replay the draft's steps from graphs (``SecondModel.enable_graphs``): one-token steps
        (every draft step after a round's first) and a round's first step (the target's token,
        behind the last accepted draft when all were accepted, or more after rounds the draft did
        not draft); with ``loop_steps`` (k), rounds that draft greedily to the end from one graph,
        and with ``sampled_loop`` rounds with sampled requests too."""
        self.draft.enable_graphs(graphs, batch_sizes, max_seq_len, loop_steps, loop_first, sampled_loop)

    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.draft.free(seq.blocks)

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
        return max(0, min(k, req.max_model_len - n - 1, self.draft.max_len - n + 1))

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
            if not self.draft.reserve(seq.blocks, len(target) + cap):
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
            sampled = [row for row, i in enumerate(active) if not self.drafts_greedily(live[i][0])]
            # (greedy rows need only the argmax and its probability)
            logits, best_p, best = self.draft.step(feeds, argmax=len(sampled) < len(active))
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

    def _sample(self, rows: list[tuple[Request, DraftSeq]], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens [n] for sampled requests, each drawn from its request's sampling
        distribution with the sequence's generator, and those distributions [n, vocab]."""
        return self.draft.sample(logits, [req for req, _ in rows], [seq.generator for _, seq in rows])

