"""The `deepspark` drafter: the draft model proposes five tokens, and only those worth verifying
are sent to the target.

Rule. For draft position i of a request the drafter knows the draft's own probability c_i of the
token it proposed. An online table, indexed by (confidence bucket of c_i, position i), estimates the
chance a_i that the target accepts such a draft; it starts from the bucket's midpoint (a prior worth
``prior_strength`` observations) and learns from every verification. Draft j can only be accepted
if drafts 1..j all are, so verifying it is worth P_j = a_1 * ... * a_j expected accepted tokens for
one verified token. A request verifies its leading drafts while P_j >= ``min_value``. With a
per-step ``verify_budget`` (tokens), the budget goes to the (request, j) pairs of highest P_j across
the batch; since P_j shrinks along j, the chosen drafts of each request stay a prefix.
"""
from __future__ import annotations

from pydantic import Field

from deepinfer.plugins import DraftProposal, Request
from deepinfer_builtin.draft_model import DraftModelDrafter, DraftModelOptions


class DeepSparkOptions(DraftModelOptions):
    min_value: float = Field(0.25, ge=0.0, le=1.0,
                             description="verify draft j while the estimated chance that drafts 1..j "
                                         "are all accepted is at least this")
    verify_budget: int = Field(0, ge=0, description="draft tokens verified per step over the batch (0: no cap)")
    early_stop: bool = Field(True, description="stop drafting a request once its latest draft falls below "
                                               "min_value: no later draft of it could be verified")
    buckets: int = Field(10, ge=1, le=100)
    prior_strength: float = Field(4.0, gt=0.0)


class AcceptanceTable:
    """Observed acceptances per (confidence bucket, draft position), with a prior."""

    def __init__(self, buckets: int, positions: int, prior_strength: float) -> None:
        self.buckets = buckets
        mid = [(b + 0.5) / buckets for b in range(buckets)]
        self.accepted = [[prior_strength * mid[b]] * positions for b in range(buckets)]
        self.trials = [[prior_strength] * positions for _ in range(buckets)]

    def bucket(self, confidence: float) -> int:
        return min(self.buckets - 1, int(confidence * self.buckets))

    def estimate(self, bucket: int, pos: int) -> float:
        return self.accepted[bucket][pos] / self.trials[bucket][pos]

    def record(self, bucket: int, pos: int, accepted: bool) -> None:
        self.trials[bucket][pos] += 1
        self.accepted[bucket][pos] += accepted


class DeepSparkDrafter(DraftModelDrafter):
    """Drafts five tokens with the draft model; verifies the prefix whose acceptance is likely."""

    name = "deepspark"
    Options = DeepSparkOptions

    def __init__(self, options: DeepSparkOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.table = AcceptanceTable(options.buckets, options.num_speculative_tokens, options.prior_strength)
        self._buckets: dict[str, list[int]] = {}  # request -> buckets of its pending drafts

    def value_chain(self, confidence: list[float]) -> tuple[list[int], list[float]]:
        """Buckets and P_j (chance drafts 1..j all pass) for one request's drafts."""
        buckets, chain, p = [], [], 1.0
        for pos, c in enumerate(confidence):
            b = self.table.bucket(c)
            p *= self.table.estimate(b, pos)
            buckets.append(b)
            chain.append(p)
        return buckets, chain

    def worth_going_on(self, request: Request, confidence: list[float]) -> bool:
        """Whether the latest draft would be verified (P_j >= min_value); P only shrinks along j,
        so when it would not, no later draft would either."""
        return self.value_chain(confidence)[1][-1] >= self.options.min_value

    def propose(self, requests: list[Request]) -> dict[str, DraftProposal]:
        go_on = self.worth_going_on if self.options.early_stop else None
        drafts = self.runner.propose(list(requests), self.k, go_on)
        chains = {rid: self.value_chain(d.confidence) for rid, d in drafts.items()}
        n_verify = {rid: sum(1 for v in chain if v >= self.options.min_value) for rid, (_, chain) in chains.items()}
        budget = self.options.verify_budget
        if budget and sum(n_verify.values()) > budget:
            ranked = sorted(((v, rid, j) for rid, (_, chain) in chains.items()
                             for j, v in enumerate(chain[:n_verify[rid]])), reverse=True)[:budget]
            n_verify = dict.fromkeys(chains, 0)
            for _, rid, j in ranked:
                n_verify[rid] = max(n_verify[rid], j + 1)
        out = {}
        for rid, d in drafts.items():
            self._buckets[rid] = chains[rid][0]
            if n_verify[rid]:
                out[rid] = DraftProposal(d.tokens, d.probs, n_verify[rid])
        return out

    def observe(self, request: Request, num_verified: int, num_accepted: int) -> None:
        buckets = self._buckets.pop(request.request_id, None)
        if buckets is None:
            return
        for pos in range(min(num_verified, len(buckets))):
            self.table.record(buckets[pos], pos, pos < num_accepted)

    def release(self, request: Request) -> None:
        self._buckets.pop(request.request_id, None)
        super().release(request)
