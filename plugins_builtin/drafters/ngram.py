"""The `ngram` drafter: the continuation of the last n tokens' latest earlier occurrence."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deepinfer.plugins import Drafter, DraftProposal, Request


class NgramOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_speculative_tokens: int = Field(5, ge=1, le=16)
    max_n: int = Field(4, ge=1)
    min_n: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _order(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) must not exceed max_n ({self.max_n})")
        return self


def ngram_continuation(tokens: list[int], max_n: int, min_n: int, k: int) -> list[int]:
    """Up to k tokens following the most recent earlier match of the longest suffix n-gram (a scan
    of the whole sequence: the reference that ``SuffixIndex`` is tested against)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):  # latest match first, excluding the tail itself
            if tokens[start:start + n] == tail:
                cont = tokens[start + n:start + n + k]
                if cont:
                    return cont
    return []


class SuffixIndex:
    """``ngram_continuation`` for a sequence that only grows, from an index of its n-grams: each
    call indexes only the tokens added since the last, so a lookup costs O(new tokens), not a scan
    of the whole sequence (which made the ngram drafter the slowest at 64 requests).

    The index maps every n-gram (min_n <= n <= max_n) that ends before the sequence's last token to
    its latest start; the suffix's earlier occurrences are exactly those."""

    __slots__ = ("_ends", "index", "max_n", "min_n")

    def __init__(self, max_n: int, min_n: int) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.index: dict[tuple[int, ...], int] = {}
        self._ends = 0  # n-grams ending (exclusively) at or before this position are indexed

    def lookup(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """(up to k tokens after the latest earlier occurrence of the longest matching suffix, its
        length n); ([], 0) when no suffix of at least min_n tokens occurred before."""
        length = len(tokens)
        if length < self._ends + 1:  # not the sequence indexed so far (it never shrinks): start over
            self.index.clear()
            self._ends = 0
        index = self.index
        for end in range(max(self._ends + 1, self.min_n), length):  # n-grams ending before the last token
            for n in range(self.min_n, min(self.max_n, end) + 1):
                index[tuple(tokens[end - n:end])] = end - n
        self._ends = max(self._ends, length - 1)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = index.get(tuple(tokens[length - n:]))
            if start is not None:
                return tokens[start + n:start + n + k], n
        return [], 0


class NgramDrafter(Drafter):
    """No model: prompt-lookup decoding, good for text that repeats its context."""

    name = "ngram"
    Options = NgramOptions

    def __init__(self, options: NgramOptions, ctx) -> None:
        super().__init__(options, ctx)
        self._index: dict[str, SuffixIndex] = {}

    @property
    def max_draft_tokens(self) -> int:
        return self.options.num_speculative_tokens

    def propose(self, requests: list[Request]) -> dict[str, DraftProposal]:
        o = self.options
        out = {}
        for req in requests:
            index = self._index.get(req.request_id)
            if index is None:
                index = self._index[req.request_id] = SuffixIndex(o.max_n, o.min_n)
            cont, _ = index.lookup(req.all_token_ids, o.num_speculative_tokens)
            if cont:
                out[req.request_id] = DraftProposal(cont)
        return out

    def release(self, request: Request) -> None:
        self._index.pop(request.request_id, None)
