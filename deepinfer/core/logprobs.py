"""One position's logprobs as the engine returns them (pure Python: the API process unpickles them
without importing torch)."""
from __future__ import annotations

from collections.abc import Iterable


class TokenLogprobs(dict[int, float]):
    """One position's logprobs by token id: the position's own token first (the one sampled, or
    the prompt's), then the k likeliest. Ranks as vLLM's ``Logprob.rank``: ``rank`` is that first
    token's rank in the vocabulary, the number of tokens whose logprob is at least its own (1: none
    is higher; a tie takes the lower place), and the k likeliest rank 1 to k in their order
    (``top``); ``rank_of`` gives any listed token's. A dict in every other way: it compares equal
    to one of the same items, and pickles with its ranks."""

    __slots__ = ("rank", "top")

    def __init__(self, items: Iterable[tuple[int, float]] = (), rank: int | None = None,
                 top: tuple[int, ...] = ()) -> None:
        super().__init__(items)
        self.rank, self.top = rank, top

    def __reduce__(self):
        return type(self), (list(self.items()), self.rank, self.top)

    def rank_of(self, token: int) -> int | None:
        """A listed token's rank: its place among the k likeliest, else (the first token) ``rank``;
        None for a token not listed, or for the first where no rank was computed."""
        if token in self.top:
            return self.top.index(token) + 1
        return self.rank if token in self and token == next(iter(self)) else None
