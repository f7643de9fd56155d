"""The `deepspark` drafter: the draft model proposes five tokens, and only those worth verifying
are sent to the target.

Rule. For draft position i of a request the drafter knows the draft's confidence c_i: the top
probability of the distribution the draft came from (for a greedy draft, the probability of the
token it proposed; for a drawn one not its own, so that whether a draft is verified never depends
on its value, which would bias the rejection sampler: DraftRunner.propose). An online table, indexed by (confidence bucket of c_i, position i), estimates the
chance a_i that the target accepts such a draft; it starts from the bucket's midpoint (a prior worth
``prior_strength`` observations) and learns from the verifications (of at most about
``learn_per_round`` requests a round, in turn: a sample keeps it current). Draft j can only be accepted
if drafts 1..j all are, so verifying it is worth P_j = a_1 * ... * a_j expected accepted tokens for
one verified token. A request verifies its leading drafts while P_j >= ``min_value``. With a
per-step ``verify_budget`` (tokens), the budget goes to the (request, j) pairs of highest P_j across
the batch; since P_j shrinks along j (and a tie goes to the earlier draft), the chosen drafts of
each request stay a prefix, and whether draft j is chosen depends on c_1..c_j only.

Round depth (``cost_aware``). A round costs C0 (the target's verification step and the engine's
work around it), t1 for its first draft step (which also feeds the draft the round's new tokens,
after the proposal's own work) and t for each later one, all measured as it runs (moving averages
of wall time; t is taken as t1 until a round goes past its first step, and never above t1; C0
leaves out that eager verification grows with the drafts verified, which leans towards deep
rounds). After j drafts the round expects E tokens (per request, 1 plus the P_i of its verified
drafts) for T = C0 + t1 + (j - 1) t. Another draft step adds
G = sum over the requests still drafting of P_j * a_j (a_j: the table's acceptance at the next
position over all buckets), counting only drafts that would be verified. The round drafts on while
G / t > (1 - ``depth_margin``) E / T: while the next step adds tokens about as fast as the round
so far or faster (deeper rounds accept more a target step at about the same speed: plugins.md).
This ends a large batch's rounds early where verification is cheap beside drafting (small models
on a GPU), and lets rounds run to k where a draft step is cheap beside the target's.

Verification in device graphs. When the engine replays verification steps from graphs (CUDA
devices), every request's k + 1 rows are computed whether verified or not, so the threshold for
verifying (and for the early stop) drops from ``min_value`` to 0 and the round depth alone decides
(``verify_all_in_graphs``, on by default; decided when the engine enables graphs, so steps that
still verify eagerly there verify every draft too).

Rounds that draft nothing (``skip_when_slower``). Where the engine verifies in device graphs, a
round drafts and verifies all k whatever the batch, and at large batches plain decode steps may
give more tokens a second (so may a CPU's eager steps of large batches). There (``"always"``, the
default; ``"graphs"``: in device graphs only), batches of at least ``skip_min_batch`` requests (by
default any batch in device graphs, 8 or more elsewhere: the ``skip_min_batch`` property) draft nothing for a round unless speculating is measured ``skip_margin`` faster, and once
speculating, go on while it is faster at all (RoundRates: a round's time to the next proposal and
generated tokens a request, per batch size class), with now and then four rounds of the other
kind (a speculative round of requests mostly within their first ``warmup_tokens`` tokens, which
accept the fewest drafts, is not measured: a look runs up to eight rounds longer instead). Where none waits and every request has max_tokens, the batch only shrinks and is done when
its last request is, so they compare by the time until then (RoundRates.drain: each request's
tokens left, over its own tokens a speculative round so far where speculating, rounds priced at the
requests still running): requests that accept unevenly thin the batch early, which per-round rates
do not see. Plain steps chosen there run to the batch's end without looks, unless a request joins.
A request alone (the only one running, none waiting) takes one kind to its end, the whole request
timed as a sample of its kind if it was alone from its first round (round_rates.RequestAlone): at
batch 1 a few rounds' rates follow the prompt and the place in it more than the kind (plugins.md).
Where rounds chain, the next round's kind is chosen at the verification (``on_verified``). This
is vLLM's disabling of speculation by batch size, measured instead of set.

Lookup first (``lookup``: repeated context as a free draft, lookup.py) and drafting in one graph
(``loop_graph``: then all k are drafted and the rule picks each verified prefix): docs/plugins.md.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from deepinfer.plugins import DraftProposal, Request, hookimpl
from deepinfer.plugins.capabilities import Rests, SkipsRounds
from deepinfer_builtin.drafters.deepspark.lookup import LookupDrafts
from deepinfer_builtin.drafters.deepspark.options import DeepSparkOptions
from deepinfer_builtin.drafters.deepspark.round_rates import (
    AcceptanceTable,
    RequestAlone,
    RoundCosts,
    RoundRates,
    rounds_left,
)
from deepinfer_builtin.drafters.draft_model.drafter import DraftModelDrafter
from deepinfer_builtin.drafters.draft_model.seq import Draft


@dataclass(slots=True)
class _Lookup:
    """A request's drafts in this round came from the lookup, with a suffix match of this bucket."""

    bucket: int


@dataclass
class _Round:
    """A round that may become a sample of RoundRates."""
    speculative: bool
    batch: int
    start: float
    ids: set[str]
    tokens: int     # generated: one a request, plus the accepted drafts
    computed: int   # what its step should compute: one token a request, plus the drafts sent
    checked: bool = False  # its step ended as expected


class DeepSparkDrafter(DraftModelDrafter, SkipsRounds, Rests):
    """Drafts five tokens with the draft model; verifies the prefix whose acceptance is likely."""

    name = "deepspark"
    Options = DeepSparkOptions
    # the round's requests learnt from: every ``_stride``-th reported, from the ``_turn``-th (from 0) on
    _stride, _turn, _seen = 1, 0, 0

    def __init__(self, options: DeepSparkOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.table = AcceptanceTable(options.buckets, options.num_speculative_tokens, options.prior_strength)
        #: request -> its pending drafts' buckets (or drafts, bucketed when observed; or the lookup's bucket)
        self._buckets: dict[str, list[int] | Draft | _Lookup] = {}
        o = options
        # an optimistic prior: every match length gets tried before the draft model's record can rule it out
        table = AcceptanceTable(o.lookup_max_n - o.lookup_min_n + 1, self.k, o.prior_strength, 0.9)
        self.lookups = LookupDrafts(table, self.k, o.lookup_max_n, o.lookup_min_n)
        self.lookup = o.lookup
        self.costs = RoundCosts(names=("rest", "first", "step"))
        self.rates = RoundRates(options.explore_every, margin=options.skip_margin)
        self.alone = RequestAlone(options.skip_margin)
        self._running = 0  # requests running at the last step's end (a request alone: no other runs)
        #: the round under way, if it is to be a sample (closed by the next proposal)
        self._round: _Round | None = None
        self._last_kind: bool | None = None  # whether the last round speculated (any batch size)
        self._last_ids: set[str] = set()     # the last round's requests
        self._known_end: set[str] = set()    # requests last found all to have max_tokens (_choose)
        self._after_plain = False            # this round speculates after a plain step
        self._closed = False                 # no request waits: the batch only shrinks
        self._gained: dict[str, list[int]] = {}  # request -> [tokens, rounds] of its speculative rounds
        self.clock = time.perf_counter
        self._ended: float | None = None  # when the last proposal returned
        self._mark = 0.0                  # the round's last timing point
        self._plan: tuple[bool, bool, int] | None = None  # needs_tokens' choice (and size class)
        self._chained_plan: tuple[bool, bool, int, set[str]] | None = None  # on_verified's (and its requests)
        self.free_verification = False  # (verification graphs compute k + 1 rows a request anyway)
        self.in_graphs = False  # the engine verifies in device graphs (enable_graphs)

    @property
    def verify_threshold(self) -> float:
        """The P_j a draft needs to be verified: ``min_value``, or 0 when verifying is free."""
        return 0.0 if self.free_verification else self.options.min_value

    def enable_graphs(self, graphs, batch_sizes, max_seq_len) -> None:
        o = self.options  # (rounds chained behind verifications, whose drafts stay on the device: "Lookup first")
        self.lookup &= not (o.chain_rounds and o.device_drafts and o.loop_graph and o.verify_all_in_graphs
                            and not o.verify_budget)
        if self.lookup:  # the round after a lookup's feeds the draft up to k + 1 tokens
            self.loop_first = self.k + 1
        super().enable_graphs(graphs, batch_sizes, max_seq_len)
        self.free_verification = o.verify_all_in_graphs  # (the engine captures verification graphs too)
        self.in_graphs = True

    @property
    def _skipping(self) -> bool:
        """Whether rounds may draft nothing here (``skip_when_slower``; "graphs": see enable_graphs)."""
        mode = self.options.skip_when_slower
        return mode == "always" or (mode == "graphs" and self.in_graphs)

    skips_rounds = property(lambda self: self.options.overlap_plain_rounds and self._skipping)

    def needs_tokens(self, requests: list[Request]) -> bool:
        """The next round's kind, chosen now: a plain round needs no tokens (the engine may leave the
        last step running). A plain round before a speculative one is no sample (it includes that wait)."""
        speculate, sample = self._choose(requests)
        self._plan = (speculate, sample, self.rates.size_class(len(requests)))
        if speculate and self._round is not None and not self._round.speculative:
            self._round = None
        return speculate

    def on_verified(self, verified, best, best_host) -> None:
        """The next round is chained (draft-model's) only if it is to draft: its kind is chosen now."""
        self._chained_plan = None
        if self.may_skip(batch := len(verified)):
            requests = [r for r, *_ in verified]
            speculate, sample = self._choose(requests)
            self._chained_plan = (speculate, sample, self.rates.size_class(batch), {r.request_id for r in requests})
            if not speculate:
                return
        super().on_verified(verified, best, best_host)

    @property
    def skip_min_batch(self) -> int:
        """The smallest batch that may skip: the option, or by default 1 in device graphs (an H100 at
        batch 1: 0.98x no drafter skipping against 0.85x speculating every round) and 8 elsewhere (a
        small batch's speculative rounds are few, mostly each request's first, and on a CPU lost to
        plain steps where speculating was 1.36x faster)."""
        n = self.options.skip_min_batch
        return n if n is not None else (1 if self.in_graphs else 8)

    def rests_above(self) -> int | None:  # (plain steps held to a closed batch's end: RoundRates.plain_to_end)
        return self.skip_min_batch if self.rates.plain_to_end and self._closed else None

    def may_skip(self, batch: int) -> bool:  # (whether a round of batch requests may draft nothing)
        return batch >= self.skip_min_batch and self._skipping

    def _choose(self, requests: list[Request], ids: set[str] | None = None) -> tuple[bool, bool]:
        """(whether the next round drafts, whether it may be a sample): RoundRates' where it may skip."""
        if not self.may_skip(batch := len(requests)):
            self.rates.plain_to_end = False  # (RoundRates sees no such round: a request may join unseen)
            return True, False
        if self._closed and batch == 1 and self._running == 1:  # a request alone: its kind to its end
            speculate = self.alone.speculate(r := requests[0], r.request_id not in self._last_ids, self.clock())
            self.rates.plain_to_end = not speculate  # (plain steps held: the engine rests)
            return speculate, False
        self.alone.current = None  # (a request alone that another joined, or one waits or runs beside it: no sample)
        if not self._closed:
            return self.rates.speculate(batch)
        ids = ids if ids is not None else {r.request_id for r in requests}
        if not ids <= self._known_end:  # (every request there was found with max_tokens)
            if any(r.params.max_tokens is None for r in requests):
                return self.rates.speculate(batch)  # (no known end)
            self._known_end = ids
        return self.rates.speculate(batch, lambda gain: rounds_left(requests, self._gained, gain),
                                    not ids <= self._last_ids)  # (joined)

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
        """Whether the latest draft would be verified (P_j >= min_value; P only shrinks along j)."""
        return self.value_chain(confidence)[1][-1] >= self.verify_threshold

    def expected_tokens(self, chain: list[float]) -> float:
        """Tokens a request is expected to gain from verifying its drafts: 1 plus the P_j of the
        drafts it would verify."""
        return 1.0 + sum(v for v in chain if v >= self.verify_threshold)

    def another_step(self, steps: int, confidences: list[list[float]], still: list[int]) -> bool:
        """After ``steps`` draft steps: whether one more is expected to add tokens at least as fast
        as the round so far (see the module's docstring); ``still``: the requests that would go on."""
        now = self.clock()
        if steps > 1:
            self.costs.update("step", now - self._mark)
        elif not self._after_plain:  # (after plain steps, the first feeds the tokens missed)
            self.costs.update("first", now - self._mark)
        self._mark = now
        c = self.costs
        if not self.options.cost_aware or c.rest is None or c.first is None:
            return True
        # the next step's cost: a later step's, capped by the first's (always measured: see the docstring)
        step = c.first if c.step is None else min(c.step, c.first)
        chains = [self.value_chain(conf)[1] for conf in confidences]
        expected = sum(self.expected_tokens(chain) for chain in chains)
        spent = c.rest + c.first + (steps - 1) * step
        rate = self.table.position_rate(steps)
        gain = sum(v for v in (chains[i][-1] * rate for i in still) if v >= self.verify_threshold)
        return gain * spent > (1.0 - self.options.depth_margin) * expected * step

    def propose(self, requests: list[Request]) -> dict[str, DraftProposal]:
        start = self._mark = self.clock()
        batch, ids = len(requests), {r.request_id for r in requests}
        last = self._round
        if last is not None and last.checked and ids <= last.ids:
            # the last round ends here: its tokens over its time (not if one joined: its prompt ran)
            self.rates.record(last.speculative, last.batch, start - last.start, last.tokens)
        self._round = None
        chained, self._chained_plan = self._chained_plan, None  # (for these requests only)
        plan, self._plan = self._plan or (chained[:3] if chained and ids <= chained[3] else None), None
        if plan is not None:  # chosen by needs_tokens or on_verified (a sample only if the requests
            speculate, sample, size = plan  # that finished since left its class)
            sample = sample and size == self.rates.size_class(batch)
        else:
            speculate, sample = self._choose(requests, ids)
        # a sample only after a round of its kind, without a newcomer (whose prompt the draft computes)
        sample = sample and self._last_kind is speculate and ids <= self._last_ids
        if sample and speculate and self._warming(requests) and self.rates.unsampled(self.rates.size_class(batch)):
            sample = False  # (a look at speculating then runs a round longer)
        self._after_plain = speculate and self._last_kind is False
        self._last_kind, self._last_ids = speculate, ids
        if speculate:
            out = self._draft(requests, start)
        else:  # (the plain step is not a speculative round's rest)
            self._ended, out = None, {}
            self.lookups.round_starts(start, None)
        if sample:  # every request gains one token, plus its accepted drafts (observe)
            self._round = _Round(speculate, batch, start, ids, batch, batch + sum(len(p.verified) for p in out.values()))
        return out

    def _warming(self, requests: list[Request]) -> bool:
        """Whether over a quarter of the requests are within their first ``warmup_tokens`` generated
        tokens: a speculative round of theirs is then no sample of RoundRates. A request's first
        rounds accept the fewest drafts (H200, demo pair, every round speculating from the start:
        0.25-1.75 accepted in rounds 1-5, 3.00-4.00 in rounds 6-10; after 8 plain steps 3.21 from
        the first: benchmarks.md, session 49), and in a batch that nothing joins the looks at
        speculating come at its start, so they took speculation for slower than it is."""
        warm = self.options.warmup_tokens
        return 4 * sum(1 for r in requests if r.num_output_tokens < warm) > len(requests)

    @hookimpl
    def deepinfer_step_end(self, engine, num_tokens: int) -> None:
        """A round is a sample only if its step computed just its tokens and drafts (no prompt)."""
        self._closed = engine is not None and engine.scheduler.num_waiting == 0
        self._running = engine.scheduler.num_running if engine is not None else 0
        self._plan = None  # (a plan no proposal took: every request finished meanwhile)
        r = self._round
        if r is not None:
            if r.checked or num_tokens != r.computed:
                self._round = None
            r.checked = True

    def _draft(self, requests: list[Request], start: float) -> dict[str, DraftProposal]:
        go_on = self.worth_going_on if self.options.early_stop else None
        self._stride = max(1, -(-len(requests) // self.options.learn_per_round))
        self._turn, self._seen = (self._turn + 1) % self._stride, 0
        if self._ended is not None:
            self.costs.update("rest", start - self._ended)
        looked_up = {}
        search = self.lookup and len(requests) < self.options.lookup_max_batch
        if self.lookup:  # (only the model rounds of batches it serves are timed for its comparison)
            self.lookups.round_starts(start, "model" if search else None)
        if search:
            for rid, (proposal, bucket) in self.lookups.choose(requests, self.verify_threshold).items():
                self._buckets[rid] = _Lookup(bucket)
                looked_up[rid] = proposal
        if looked_up:
            rest = [r for r in requests if r.request_id not in looked_up]
            if not rest:  # a round of lookups: the draft model does not run
                self.lookups.set_kind("lookup")
                self._ended = self.clock()
                return looked_up
            # the lookups' requests join the loop graph's round (drafts unused): no long catch-up later
            if not (self.in_graphs and self.runner.loop_size(
                    len(requests), max(len(r.all_token_ids) for r in requests), self.k, requests) is not None):
                requests = rest
        # a round the loop graph takes drafts all k (then the rule chooses); the others step by step
        budget = self.options.verify_budget
        verify_all = self.verify_threshold == 0.0 and not budget  # every P_j passes
        # verifying everything, the drafts may stay on the device until the verification is read
        drafts = self.runner.propose(list(requests), self.k, go_on, self.another_step, whole_rounds=True,
                                     lazy=verify_all and self.options.device_drafts)
        self._ended = self.clock() if drafts or looked_up else None
        if looked_up:
            drafts = {rid: d for rid, d in drafts.items() if rid not in looked_up}
        if verify_all:  # the buckets are taken from the confidences when the result comes (observe)
            self._buckets.update(drafts)
            return {rid: DraftProposal(d.tokens, d.probs, len(d.tokens), d.source)
                    for rid, d in drafts.items()} | looked_up
        chains = {rid: self.value_chain(d.confidence) for rid, d in drafts.items()}
        n_verify = {rid: sum(1 for v in chain if v >= self.verify_threshold) for rid, (_, chain) in chains.items()}
        if budget and sum(n_verify.values()) > budget:
            ranked = sorted(((v, -j, rid) for rid, (_, chain) in chains.items()
                             for j, v in enumerate(chain[:n_verify[rid]])), reverse=True)[:budget]
            n_verify = dict.fromkeys(chains, 0)
            for _, _, rid in ranked:  # (a prefix of each request's drafts: P_j never grows along j)
                n_verify[rid] += 1
        out = looked_up
        for rid, d in drafts.items():
            self._buckets[rid] = chains[rid][0]
            # (none verified: proposed all the same, for the metrics; the step is a plain one)
            out[rid] = DraftProposal(d.tokens, d.probs, n_verify[rid])
            if not n_verify[rid]:  # a round for it all the same, of one token (observe sees only the verified)
                self._gained[rid] = [n + 1 for n in self._gained.get(rid, (0, 0))]
        return out

    def observe(self, request: Request, num_verified: int, num_accepted: int) -> None:
        r = self._round
        if r is not None:
            r.tokens += num_accepted
        gained = self._gained.setdefault(request.request_id, [0, 0])  # (its tokens and rounds)
        gained[0] += num_accepted + 1
        gained[1] += 1
        buckets = self._buckets.pop(request.request_id, None)
        self._seen += 1
        if buckets is None or (self._seen - 1 - self._turn) % self._stride:
            return
        # a_i is the chance draft i passes once drafts 1..i-1 have: the drafts after the first
        # rejected one were never put to that test, so they teach nothing
        tested = num_verified if num_verified <= num_accepted else num_accepted + 1
        kind = type(buckets)
        if kind is _Lookup:
            self.lookups.observe(buckets.bucket, tested, num_accepted)
            return
        self.lookups.observe(None, tested, num_accepted)
        if kind is Draft:  # (the confidences' buckets taken now)
            self.table.record_tested(buckets.confidence[:tested], num_accepted, confidences=True)
        else:
            self.table.record_tested(buckets[:tested], num_accepted)

    def release(self, request: Request) -> None:
        self.alone.release(request, self.clock)
        self._buckets.pop(request.request_id, None)
        self._gained.pop(request.request_id, None)
        self._known_end.discard(request.request_id)  # (an id may come back with other parameters)
        self.lookups.release(request.request_id)
        super().release(request)
