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
    """Up to k tokens following the most recent earlier match of the longest suffix n-gram."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):  # latest match first, excluding the tail itself
            if tokens[start:start + n] == tail:
                cont = tokens[start + n:start + n + k]
                if cont:
                    return cont
    return []


class NgramDrafter(Drafter):
    """No model: prompt-lookup decoding, good for text that repeats its context."""

    name = "ngram"
    Options = NgramOptions

    @property
    def max_draft_tokens(self) -> int:
        return self.options.num_speculative_tokens

    def propose(self, requests: list[Request]) -> dict[str, DraftProposal]:
        o = self.options
        out = {}
        for req in requests:
            cont = ngram_continuation(req.all_token_ids, o.max_n, o.min_n, o.num_speculative_tokens)
            if cont:
                out[req.request_id] = DraftProposal(cont)
        return out
