"""Rounds drafted in loop graphs: a round's k draft steps in one replay (``SecondModel.run_loop``),
for greedy and sampled requests, and a greedy round chained right behind the verification of the
last one, before the host has read it (``SecondModel.run_chained``). DraftRunner takes these
methods from ``LoopRounds``."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer.plugins import Request, SecondModel
from deepinfer_builtin.drafters.draft_model.seq import Draft, DraftSeq


@dataclass(slots=True)
class ChainedRound:
    """A round queued behind a verification (``LoopRounds.chain``), for the next proposal."""

    round: Any  # the round (SecondModel.run_chained)
    prev: Any   # the round whose drafts were verified (SecondModel.run_loop)
    best: Any   # the verification's target tokens, copied to the host (on_verified's best_host)
    #: request id -> (its row in the round, its draft sequence, its length before the verified
    #: tokens, its first row in ``best``, its row in ``prev``)
    rows: dict[str, tuple[int, DraftSeq, int, int, int]]


class LoopRounds:
    """DraftRunner's rounds in loop graphs. Uses the runner's ``draft``, ``chained``, ``seqs`` and
    ``greedy_sampled``, and its ``room``."""

    draft: SecondModel
    chained: ChainedRound | None
    seqs: dict[str, DraftSeq]
    greedy_sampled: bool

    def drafts_greedily(self, req: Request) -> bool:
        """Whether the request's drafts are the draft's argmax (greedy requests; sampled ones too
        with ``greedy_sampled``), so that the greedy loop graph may draft its rounds."""
        return req.params.greedy or self.greedy_sampled

    def _sampled(self, requests: Sequence[Request]) -> Sequence[Request] | None:
        """The requests as ``SecondModel.run_loop`` takes them: None where all draft greedily."""
        return None if all(map(self.drafts_greedily, requests)) else requests

    def _propose_in_loop(self, live: list[tuple[Request, DraftSeq]], feeds, k: int,
                         lazy: bool) -> dict[str, Draft] | None:
        """Rounds of k drafts for every request from a loop graph, with one copy to the host
        (waited for here, or with ``lazy`` when first read): the greedy one where every request
        drafts greedily, else a sampled one, each sampled request's drafts drawn with k numbers of
        its generator, the k it would take step by step. None when it does not cover the round (a
        batch or a length beyond the captured ones)."""
        sampled = self._sampled([r for r, _ in live])
        generators = None if sampled is None else [seq.generator for _, seq in live]
        rnd = self.draft.run_loop(feeds, k, sampled, generators, lazy)
        return None if rnd is None else self._drafts(rnd, live, range(len(live)), k, lazy)

    @staticmethod
    def _drafts(rnd: Any, live: list[tuple[Request, DraftSeq]], rows: Sequence[int], k: int,
                lazy: bool) -> dict[str, Draft]:
        """The drafts of a loop round for each request, from its row of the round (and of its
        distributions ``rnd.q`` [n, k, V], a sampled round's, for its sampled requests)."""
        out = {}
        for (req, seq), i in zip(live, rows, strict=True):
            seq.pending = (rnd, i)  # the loop computed the KV of all but the last
            probs = None if rnd.q is None or req.params.greedy else rnd.q[i]
            if not lazy:
                seq.settle()
                out[req.request_id] = Draft(rnd.tokens(i), probs, rnd.lists()[1][i])
            else:
                out[req.request_id] = Draft([-(i * k + j + 1) for j in range(k)], probs,
                                            lambda i=i: rnd.lists()[1][i], rnd.source)
        return out

    @torch.inference_mode()
    def chain(self, verified: Sequence[tuple[Request, Sequence[int], int]], best: torch.Tensor,
              best_host: Any, k: int) -> None:
        """Queue the next greedy round right behind a verification, before the host has read it
        (``Drafter.on_verified``): where every request verified all k drafts of the last loop
        round, still on the device, the loop graph counts the accepted drafts from ``best`` itself
        (``SecondModel.run_chained``). The next ``propose`` takes the round if its requests are
        among these and their tokens are what the verification gave; else it is dropped (a later
        feed rewrites the draft's cache past the accepted tokens, which the host never counted)."""
        self.chained = prev = None
        if self.draft.loop_steps != k or not verified:
            return
        bases, vstarts, dstarts, rows = [], [], [], {}
        for i, (req, drafts, at) in enumerate(verified):
            seq, base = self.seqs.get(req.request_id), len(req.all_token_ids)
            if (seq is None or seq.pending is None or req.draft is None or len(drafts) != k
                    or self.room(req, k, base + k + 1) < k):  # (the round after may not draft all k)
                return
            rnd, row = seq.pending
            prev, first = prev or rnd, row * k  # (the row's first draft in the round's output)
            # the drafts verified are this row's placeholders, -(first + 1) to -(first + k), laid out
            # whole by _drafts: the first and the last name them
            if (rnd is not prev or rnd.source is None or req.draft.source is not rnd.source or len(seq.tokens) != base
                    or drafts[0] != -(first + 1) or drafts[-1] != -(first + k)):
                return
            bases.append(base)
            vstarts.append(at)
            dstarts.append(first)
            rows[req.request_id] = (i, seq, base, at, row)
        seqs = [(seq, base) for _, seq, base, _, _ in rows.values()]  # (reserved once every check has passed)
        if (size := self.loop_size(len(verified), max(bases) + k + 1, k)) is None or not all(
                self.draft.reserve(seq.blocks, base + 2 * k) for seq, base in seqs):
            return
        tables = [[b.block_id for b in seq.blocks] for seq, _ in seqs]
        rnd = self.draft.run_chained(size, best, prev.source.tokens, bases, vstarts, dstarts, tables)
        self.chained = ChainedRound(rnd, prev, best_host, rows)

    def _take_chained(self, chained: ChainedRound, requests: list[Request], k: int,
                      lazy: bool) -> dict[str, Draft] | None:
        """The chained round's drafts, if it was queued for these requests as they are now: each
        holds exactly its tokens before the verification and what the verification gave."""
        best = chained.best.wait().tolist()  # (read already: the verification has been taken)
        live, rows = [], []
        for req in requests:
            entry = chained.rows.get(req.request_id)
            if entry is None:
                return None
            row, seq, base, at, prev_row = entry
            if self.seqs.get(req.request_id) is not seq or seq.pending is None or seq.pending[0] is not chained.prev:
                return None
            gave = SecondModel.accept_greedy(chained.prev.tokens(prev_row), best[at:at + k + 1])
            if req.all_token_ids[base:] != gave:
                return None
            live.append((req, seq, base + min(len(gave) - 1, k - 1)))
            rows.append(row)
        for req, seq, start in live:  # the chained round's first step fed the tokens from start on
            seq.settle()
            del seq.tokens[start:]
            seq.tokens.extend(req.all_token_ids[start:])
            seq.committed = len(req.all_token_ids)
        return self._drafts(chained.round, [(r, s) for r, s, _ in live], rows, k, lazy)

    def loop_size(self, num_seqs: int, longest: int, k: int, requests: Sequence[Request] | None = None) -> int | None:
        """The loop graph's size for a round of k drafts over sequences of at most ``longest``
        tokens (of ``requests``: the loop graphs that would draft them; else a greedy round), or
        None where it does not take the round."""
        return self.draft.loop_size(num_seqs, longest, k, None if requests is None else self._sampled(requests))
