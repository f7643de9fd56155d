"""A request's sequence in the draft model's own cache, and the drafts a round proposes for it."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer.plugins import Block, Request


@dataclass(slots=True)
class DraftSeq:
    """A request's sequence in the draft model's cache (``DraftRunner``)."""

    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in the draft cache
    committed: int = 0  # the request's length at the last proposal: history before it is shared
    blocks: list[Block] = field(default_factory=list)
    generator: torch.Generator | None = None
    #: a loop round (``SecondModel.run_loop``) whose drafts are still on their way to the host, and
    #: this sequence's row: their KV (all but the last's) is in the draft cache, their values join
    #: ``tokens`` when read
    pending: tuple[Any, int] | None = None

    def settle(self) -> None:
        if self.pending is not None:
            rnd, i = self.pending
            self.pending = None
            self.tokens.extend(rnd.tokens(i)[:-1])


class Draft:
    """One request's drafts. ``tokens`` are placeholders for ``source`` (a loop round's tokens on
    the device: ``DraftProposal.source``) when the round left them there; ``confidence`` (the draft's probability of each token
    it proposed) is then read from the host copy when first asked for."""

    __slots__ = ("_confidence", "probs", "source", "tokens")

    def __init__(self, tokens: list[int], probs: torch.Tensor | None,
                 confidence: list[float] | Callable[[], list[float]], source: Any = None) -> None:
        self.tokens = tokens
        self.probs = probs  # [k, vocab] draft distributions (None: deterministic, the draft's argmax)
        self._confidence = confidence
        self.source = source

    @property
    def confidence(self) -> list[float]:
        if callable(self._confidence):
            self._confidence = self._confidence()
        return self._confidence


def common_prefix(a: list[int], b: list[int], known: int) -> int:
    """Length of the common prefix, given that the first ``known`` tokens agree."""
    n = min(len(a), len(b))
    i = min(known, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def draft_seed(req: Request, engine_seed: int) -> int:
    """The seed of a request's draft generator, which draws its sampled drafts. Never the request's
    own seed: the verification takes its uniform numbers from a generator of that seed, and a
    draft drawn with the same numbers would be correlated with its own test (the output then
    leaves the target's distribution). Seeded requests derive it from their seed, the others from
    the engine's seed and their id: the same in every process (not Python's salted ``hash``)."""
    key = f"draft {req.params.seed}" if req.params.seed is not None else f"draft {engine_seed} {req.request_id}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1
