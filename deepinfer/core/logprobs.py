"""One position's logprobs as the engine returns them (pure Python: the API process unpickles them
without importing torch)."""
from __future__ import annotations

from collections.abc import Iterable


class TokenLogprobs(dict[int, float]):
    """One position's logprobs by token id: the position's own token first (the one sampled, or
    the prompt's), then the k likeliest. ``rank`` is that first token's rank in the vocabulary
    (1: the likeliest; 1 plus the number of tokens of a higher logprob), as vLLM's ``Logprob.rank``;
    ``rank_of`` gives any listed token's. A dict in every other way: it compares equal to one of
    the same items, and pickles with its rank."""

    __slots__ = ("rank",)

    def __init__(self, items: Iterable[tuple[int, float]] = (), rank: int | None = None) -> None:
        super().__init__(items)
        self.rank = rank

    def __reduce__(self):
        return type(self), (list(self.items()), self.rank)

    def rank_of(self, token: int) -> int | None:
        """The rank of a listed token: the first's ``rank``; one of the k likeliest has every token
        of a higher logprob listed beside it, so its rank is counted here. None for a token not
        listed, or for the first where no rank was computed."""
        if token not in self:
            return None
        if token == next(iter(self)):
            return self.rank
        v = self[token]
        return 1 + sum(1 for w in self.values() if w > v)
