"""What deepspark measures as it runs: how often drafts are accepted (AcceptanceTable, for what
to verify), a round's parts (RoundCosts, for the round depth), the seconds a generated token of
speculative rounds and of plain steps (RoundRates, for rounds that draft nothing) and of whole
requests alone (RequestAlone). See
deepspark.py's docstring."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from deepinfer.plugins import Request, RequestStatus


class AcceptanceTable:
    """Observed acceptances per (confidence bucket, draft position), with a prior."""

    def __init__(self, buckets: int, positions: int, prior_strength: float, prior: float | None = None) -> None:
        self.buckets = buckets
        # (the prior: the confidence bucket's midpoint, or one for all)
        mid = [(b + 0.5) / buckets if prior is None else prior for b in range(buckets)]
        self.accepted = [[prior_strength * mid[b]] * positions for b in range(buckets)]
        self.trials = [[prior_strength] * positions for _ in range(buckets)]

    def bucket(self, confidence: float) -> int:
        return min(self.buckets - 1, int(confidence * self.buckets))

    def estimate(self, bucket: int, pos: int) -> float:
        return self.accepted[bucket][pos] / self.trials[bucket][pos]

    def position_rate(self, pos: int) -> float:
        """Acceptance at a draft position over all buckets, observations weighted as they came."""
        return sum(a[pos] for a in self.accepted) / sum(t[pos] for t in self.trials)

    def record(self, bucket: int, pos: int, accepted: bool) -> None:
        self.trials[bucket][pos] += 1
        self.accepted[bucket][pos] += accepted

    def record_tested(self, cells: list[int] | list[float], accepted: int, confidences: bool = False) -> None:
        """One verification: the drafts at positions 0.. (of these buckets, or with ``confidences``
        of these confidences) were tested, and the first ``accepted`` of them passed. (Called for
        every request of a round: written out for speed.)"""
        trials, passed, n = self.trials, self.accepted, self.buckets
        for pos, b in enumerate(cells):
            if confidences:  # bucket(b), written out
                b = int(b * n)
                if b >= n:
                    b = n - 1
            trials[b][pos] += 1
            if pos < accepted:
                passed[b][pos] += 1


class RoundCosts:
    """Moving averages of a round's parts, in seconds, one attribute each (None until measured):
    by default ``rest`` (from the end of one proposal to the start of the next: verification and
    the engine's work) and ``step`` (a draft step); deepspark's also ``first`` (a round's first
    draft step, ``step`` then being the later ones). A sample over 4x the average (an idle engine
    between proposals) counts as 4x."""

    rest: float | None
    first: float | None
    step: float | None

    def __init__(self, weight: float = 0.2, names: tuple[str, ...] = ("rest", "step")) -> None:
        self.weight, self.names = weight, names
        for name in names:
            setattr(self, name, None)

    def update(self, name: str, seconds: float) -> None:
        old = getattr(self, name)
        new = seconds if old is None else old + self.weight * (min(seconds, 4 * old) - old)
        setattr(self, name, max(new, 1e-9))  # a coarse clock's 0 must not pin the average there

    @property
    def known(self) -> bool:
        """Every part measured (each average stays above 0)."""
        return all(getattr(self, name) is not None for name in self.names)


class RoundRates:
    """Seconds per generated token (a request) of speculative rounds and of plain steps (rounds
    that draft nothing), per batch size class (powers of two), from each kind's last ``window``
    rounds: the slowest quarter of them left out (warm-up, an idle engine between rounds; unless
    ``trim`` is off), the
    rest's seconds over their tokens (a speculative round's tokens vary, so averaging each round's
    own rate would overstate its cost); and which kind the next round is.

    Rounds of a kind run ``look`` in a row, of which all but the first are samples (the first
    speculative round after plain steps also feeds the draft the tokens it missed); a round the
    caller leaves unmeasured (``unsampled``) makes its look one round longer, up to ``2 * look``
    rounds more, after which its rounds count. Each kind is
    measured first, then the faster runs (speculating only if faster by ``margin``, to start and
    to take over; plain steps whenever faster); after ``gap - look`` rounds of it, ``look`` of the other.
    The gap starts at ``explore_every`` and doubles with every look that finds the same kind
    faster (at least to twice the run the look ends, which plain steps held to a batch's end make
    longer than the gap), up to ``max_gap``: a look costs, and the faster kind mostly stays the
    faster; when the other takes over, the gap starts over. Where nothing will join the batch, speculation's rate
    is scaled by how the time until the batch is done compares (``speculate``'s ``closed``)."""

    def __init__(self, explore_every: int, window: int = 12, max_gap: int = 1024, look: int = 4,
                 margin: float = 0.15, drain_every: int = 8, trim: bool = True) -> None:
        self.explore_every = max(explore_every, 2)
        self.max_gap = max(max_gap, explore_every)
        self.look = min(look, self.explore_every)
        self.margin = margin
        self.window = window
        self.trim = trim  # (False: every sample of the window counts, the slowest quarter too)
        self.drain_every = drain_every
        #: (speculative, size class) -> the last rounds' (seconds, tokens a request)
        self.rounds: dict[tuple[bool, int], deque[tuple[float, float]]] = {}
        self._runs: dict[int, tuple[bool, int]] = {}       # size class -> (kind, rounds in a row)
        self._plan: dict[int, list[bool]] = {}             # size class -> the next rounds' kinds
        self._best: dict[int, tuple[bool, int]] = {}       # size class -> (the faster kind, gap)
        self._extra: dict[int, int] = {}  # size class -> rounds the look under way may still add (unsampled)
        #: size class -> [what a batch that nothing joins multiplies speculation's rate by, uses left]
        self._closed: dict[int, list] = {}
        #: a batch that nothing joins chose plain steps: they run to its end (see speculate)
        self.plain_to_end = False

    @staticmethod
    def size_class(batch: int) -> int:
        return 1 << max(0, batch - 1).bit_length()

    def rate(self, speculative: bool, size: int) -> float | None:
        """Seconds a token a request (a plain step's time; a speculative round's over the tokens
        it gives each request) at a size class, or None before its first sample."""
        rounds = self.rounds.get((speculative, size))
        if not rounds:
            return None
        kept = self._kept(rounds)
        return sum(sec for sec, _ in kept) / sum(tok for _, tok in kept)

    def _kept(self, rounds: deque[tuple[float, float]]) -> list[tuple[float, float]]:
        """The rounds a rate counts: all but the slowest quarter (of three or more; all without ``trim``)."""
        cut = (len(rounds) + 3) // 4 if len(rounds) >= 3 and self.trim else 0
        return sorted(rounds, key=lambda r: r[0])[:len(rounds) - cut]

    def round_seconds(self, speculative: bool, size: int) -> float | None:
        """A round's seconds at a size class (the mean of the kept rounds, as ``rate`` keeps
        them), or at the nearest class measured (larger first); None if the kind has no sample."""
        sizes = sorted((s for k, s in self.rounds if k is speculative), key=lambda s: (s < size, abs(s - size)))
        if not sizes:
            return None
        kept = self._kept(self.rounds[speculative, sizes[0]])
        return sum(sec for sec, _ in kept) / len(kept)

    def drain(self, speculative: bool, rounds: list[float]) -> float | None:
        """Seconds until a batch that nothing will join is done if every round is of this kind:
        ``rounds`` holds each request's rounds still needed; each round costs what the kind's
        rounds cost at the number of requests still running (``round_seconds``)."""
        cost: dict[int, float | None] = {}
        total, done, left = 0.0, 0.0, len(rounds)
        for n in sorted(rounds):
            size = self.size_class(left)
            if size not in cost:
                cost[size] = self.round_seconds(speculative, size)
            if cost[size] is None:
                return None
            total += (n - done) * cost[size]
            done, left = n, left - 1
        return total

    @property
    def seconds(self) -> dict[tuple[bool, int], float]:
        """``rate`` of every (speculative, size class) measured."""
        return {key: self.rate(*key) for key in self.rounds}

    def record(self, speculative: bool, batch: int, seconds: float, tokens: int) -> None:
        """A round of ``batch`` requests that generated ``tokens`` in ``seconds``; kept as tokens a
        request, so that rounds of the different batch sizes of one class compare (steps that
        cost mostly launches take about as long at 33 requests as at 64)."""
        key = (speculative, self.size_class(batch))
        self.rounds.setdefault(key, deque(maxlen=self.window)).append((max(seconds, 1e-9), max(tokens, 1) / batch))

    def speculate(self, batch: int, closed: Callable[[float], tuple[list[float], list[float]] | None] | None = None,
                  joined: bool = False) -> tuple[bool, bool]:
        """(whether the next round at this batch size drafts, whether it will be a sample).
        ``closed``, for a batch that nothing will join: given the tokens a request that a
        speculative round gives at this size, returns each request's rounds still needed if
        speculating and if not (or None while too little is known of them); the kinds are then
        compared by the time until the batch is done (``drain``) instead of by their rates at this
        size: speculation's rate is scaled by the ratio of the two, taken anew every
        ``drain_every`` rounds of the class and when a request ``joined`` (kept from the last
        batch while None). Plain steps chosen for such a batch run to its end, at every size
        class, without looks, unless a request joins it or requests wait."""
        size = self.size_class(batch)
        plan = self._plan.setdefault(size, [])
        kind, run = self._runs.get(size, (None, 0))
        sticky = closed is not None and not joined and self.plain_to_end
        chosen = False  # (by comparing the kinds, not a look or a first measurement)
        starts_look = False  # (or a kind's first measurement: unsampled may lengthen it)
        if sticky:
            # plain steps chosen for a batch that nothing joins run to its end (whatever size class
            # it thins to), without looks: each leaves the draft a token further behind, which a
            # speculative round would first have to compute (neither rate includes that), and the
            # batch's spread only grows
            choice = False
        elif plan:
            choice = plan.pop(0)
        elif (spec := self.rate(True, size)) is None or (plain := self.rate(False, size)) is None:
            choice, starts_look = spec is None, True
            plan.extend([choice] * (self.look - 1))
        else:
            if closed is None:
                self._closed.pop(size, None)
            else:  # (the drains cost tens of microseconds a batch: they set a factor for a few rounds)
                factor = self._closed.get(size)
                if factor is None or factor[1] <= 0 or joined:
                    value = factor[0] if factor else 1.0  # (held while too little is known of the requests)
                    left = closed(self.round_seconds(True, size) / spec)
                    if left is not None:
                        spec_drain, plain_drain = self.drain(True, left[0]), self.drain(False, left[1])
                        if spec_drain is not None and plain_drain:
                            value = spec_drain * plain / (plain_drain * spec)
                    factor = self._closed[size] = [value, self.drain_every]
                factor[1] -= 1
                spec *= factor[0]  # its seconds a token as the time until the batch is done makes them
            # speculating must win by the margin, to start and to take over: its samples leave out
            # what it costs besides (rounds that catch the draft up, the first rounds after a
            # prompt, requests that advance unevenly and so need rounds after the batch thins);
            # plain steps take over as soon as they are the faster
            best, gap = self._best.get(size, (spec < plain * (1 - self.margin), self.explore_every))
            choice = not plain < spec if best else spec < plain * (1 - self.margin)
            if best != choice:
                gap = self.explore_every
            chosen = True
            if kind == choice and run >= gap - self.look:
                choice, starts_look = not choice, True
                plan.extend([choice] * (self.look - 1))
                # (at least twice the run it ends: plain steps held to a batch's end run past the
                # gap, and the next batch's look should not come sooner than one run after)
                gap = min(max(2 * gap, 2 * run), self.max_gap)
            self._best[size] = (not choice if starts_look else choice, gap)  # (a look: the faster is the other)
        if not sticky:
            self.plain_to_end = chosen and closed is not None and not choice and not plan
        if starts_look and (kind != choice or size not in self._extra):
            self._extra[size] = 2 * self.look  # (a first measurement begun again keeps what it had left)
        elif chosen:
            self._extra.pop(size, None)
        run = run + 1 if kind == choice else 1
        self._runs[size] = (choice, run)
        return choice, run > 1

    def unsampled(self, size: int) -> bool:
        """Whether the round just chosen at this size class as a sample may go unmeasured, which
        the caller asks of a round it finds unrepresentative (deepspark's requests at their start).
        A round chosen by comparing the kinds may (later rounds of its kind measure it). A round of
        a look or of a kind's first measurement may while that has run fewer than ``2 * look``
        rounds more than planned, and it then runs one round longer; after that its rounds count,
        so that every look ends, measured."""
        left = self._extra.get(size)
        if left is None:
            return True
        if left <= 0:
            return False
        self._extra[size] = left - 1
        self._plan.setdefault(size, []).insert(0, self._runs[size][0])
        return True


class RequestAlone:
    """The kind of a request alone (the only one running, none waiting), chosen by whole requests:
    it keeps the kind chosen at its first round alone to its end, and if it was alone from its first
    round and generated at least ``MIN_TOKENS`` since, its seconds over those tokens are a sample of
    that kind (plugins.md, "A request alone"). ``rates``: each kind measured first, then a request
    of the slower kind after 7 of the faster in a row, the gap doubling up to 64 requests; the last
    32 requests of each kind, all of them, count (a request's rate follows its prompt, so the
    speculative one takes many)."""

    #: a request that generated fewer is no sample: its time is mostly its first round's (where the
    #: draft computes its prompt) and what ran there for the first time (a warm-up's)
    MIN_TOKENS = 16

    def __init__(self, margin: float) -> None:
        self.rates = RoundRates(8, window=32, max_gap=64, look=1, margin=margin, trim=False)
        #: the request alone: (its id, whether it speculates, when its kind was chosen, its output
        #: tokens then, whether it was alone from its first round); None when none is (no sample)
        self.current: tuple[str, bool, float, int, bool] | None = None

    def speculate(self, request: Request, fresh: bool, now: float) -> bool:
        """Whether this request alone speculates; ``fresh``: it ran in no round before (not left
        alone midway, past its first rounds, which accept the fewest drafts)."""
        cur = self.current
        if cur is None or cur[0] != request.request_id:
            cur = self.current = (request.request_id, self.rates.speculate(1)[0], now, request.num_output_tokens, fresh)
        return cur[1]

    def release(self, request: Request, clock: Callable[[], float]) -> None:
        """A request let go: the sample, if it is the request alone and finished as one should."""
        cur = self.current
        if cur is None or cur[0] != request.request_id:
            return
        self.current = None
        tokens = request.num_output_tokens - cur[3]
        if (cur[4] and tokens >= self.MIN_TOKENS and request.status.finished
                and request.status is not RequestStatus.FINISHED_ABORTED):
            self.rates.record(cur[1], 1, clock() - cur[2], tokens)


def rounds_left(requests, gained: dict[str, list[int]], gain: float, prior: float = 4.0
                ) -> tuple[list[float], list[float]] | None:
    """Each request's rounds still needed if speculating and if not, for RoundRates.drain: its
    tokens left (to max_tokens or the context's end); speculating, over its own tokens a
    speculative round so far (``gained``: request id -> [tokens, rounds]), with ``gain`` (the
    batch's) as a prior worth ``prior`` rounds. None while the requests have had fewer than
    ``prior`` speculative rounds on average: their spread, which sets when the batch is done,
    is not known yet."""
    if sum(gained.get(r.request_id, (0, 0))[1] for r in requests) < prior * len(requests):
        return None
    spec, plain = [], []
    for r in requests:
        left = r.max_model_len - len(r.all_token_ids)
        if r.params.max_tokens is not None:
            left = min(left, r.params.max_tokens - r.num_output_tokens)
        tokens, rounds = gained.get(r.request_id, (0, 0))
        plain.append(left)
        spec.append(left * (rounds + prior) / (tokens + prior * gain))
    return spec, plain
