"""deepspark's lookup: drafts taken from the context's earlier occurrence of its last tokens, where
they are expected to pay better than the draft model's (see deepspark.py's docstring)."""
from __future__ import annotations

from deepinfer.plugins import DraftProposal, Request
from deepinfer_builtin.drafters.deepspark.round_rates import RoundCosts
from deepinfer_builtin.drafters.ngram import SuffixIndex


class LookupDrafts:
    """Per request, a suffix index of its tokens; a table (match length, position) of how often
    lookup drafts were accepted (``table``, an AcceptanceTable); what the draft model's verified
    drafts gain a request (``model_gain``, a moving average); and how long rounds of each kind take
    to the next proposal (``seconds``, a RoundCosts: ``lookup``, every request's drafts from the
    lookup; ``model``, the draft model ran)."""

    def __init__(self, table, k: int, max_n: int, min_n: int) -> None:
        self.table, self.k, self.max_n, self.min_n = table, k, max_n, min_n
        self.indexes: dict[str, SuffixIndex] = {}
        self.model_gain = 1.0
        self.seconds = RoundCosts(names=("lookup", "model"))
        self._last: tuple[str, float] | None = None  # the round under way: its kind and start

    def round_starts(self, now: float, kind: str | None) -> None:
        """A proposal starts at ``now``: the round before it (if it drafted) ends; ``kind`` is this
        one's (None: a round that drafts nothing, which is no sample)."""
        if self._last is not None:
            last, start = self._last
            self.seconds.update(last, now - start)
        self._last = None if kind is None else (kind, now)

    def set_kind(self, kind: str) -> None:
        if self._last is not None:
            self._last = (kind, self._last[1])

    def _chains(self, threshold: float) -> list[list[float]]:
        """For each match length (table bucket), the P_j of its drafts that would be verified (those
        at or above ``threshold``: a prefix, as P_j only shrinks along j)."""
        chains = []
        for bucket in range(self.table.buckets):
            chain, p = [], 1.0
            for pos in range(self.k):
                p *= self.table.estimate(bucket, pos)
                if p < threshold:
                    break
                chain.append(p)
            chains.append(chain)
        return chains

    def _candidate(self, req: Request, chains: list[list[float]]) -> tuple[list[int], int, float, int] | None:
        """(tokens, their table bucket, expected accepted, how many to verify), or None."""
        index = self.indexes.get(req.request_id)
        if index is None:
            index = self.indexes[req.request_id] = SuffixIndex(self.max_n, self.min_n)
        tokens, n = index.lookup(req.all_token_ids, self.k)
        if not tokens:
            return None
        bucket = n - self.min_n
        chain = chains[bucket][:len(tokens)]
        return (tokens, bucket, sum(chain), len(chain)) if chain else None

    def _faster(self, gain: float) -> bool:
        """Whether a round of lookups gaining ``gain`` a request gives tokens faster than the draft
        model's rounds (until both kinds are timed: yes, so that lookup rounds get timed)."""
        s = self.seconds
        return not s.known or (1.0 + gain) * s.model >= (1.0 + self.model_gain) * s.lookup

    def choose(self, requests: list[Request], threshold: float) -> dict[str, tuple[DraftProposal, int]]:
        """The requests that take the lookup's drafts, with their proposals and table buckets: all
        of them if every one has a lookup and such rounds are measured to pay better than the
        model's; else those whose lookup is expected to gain at least what the model's drafts do."""
        chains = self._chains(threshold)
        found = {r.request_id: c for r in requests if (c := self._candidate(r, chains)) is not None}
        if len(found) == len(requests) and self._faster(sum(c[2] for c in found.values()) / len(found)):
            chosen = found
        else:
            chosen = {rid: c for rid, c in found.items() if c[2] >= self.model_gain}
        return {rid: (DraftProposal(tokens, None, verify), bucket)
                for rid, (tokens, bucket, _, verify) in chosen.items()}

    def observe(self, bucket: int | None, tested: int, num_accepted: int) -> None:
        """A verification of the lookup's drafts (``bucket``) or the model's (None)."""
        if bucket is None:
            self.model_gain += 0.05 * (num_accepted - self.model_gain)
            return
        self.table.record_tested([bucket] * tested, num_accepted)

    def release(self, request_id: str) -> None:
        self.indexes.pop(request_id, None)
