"""What deepspark measures as it runs: how often drafts are accepted (AcceptanceTable, for what
to verify), a round's parts (RoundCosts, for the round depth) and the seconds a generated token of
speculative rounds and of plain steps (RoundRates, for rounds that draft nothing). See
deepspark.py's docstring."""
from __future__ import annotations

from collections import deque


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
    rounds: the slowest quarter of them left out (warm-up, an idle engine between rounds), the
    rest's seconds over their tokens (a speculative round's tokens vary, so averaging each round's
    own rate would overstate its cost); and which kind the next round is.

    Rounds of a kind run ``look`` in a row, of which all but the first are samples (the first
    speculative round after plain steps also feeds the draft the tokens it missed). Each kind is
    measured first, then the faster runs (speculating only if faster by ``margin``, to start and
    to take over; plain steps whenever faster); after ``gap - look`` rounds of it, ``look`` of the other.
    The gap starts at ``explore_every`` and doubles with every look that finds the same kind
    faster, up to ``max_gap``: a look costs, and the faster kind mostly stays the faster; when the
    other takes over, the gap starts over."""

    def __init__(self, explore_every: int, window: int = 12, max_gap: int = 1024, look: int = 4,
                 margin: float = 0.15) -> None:
        self.explore_every = max(explore_every, 2)
        self.max_gap = max(max_gap, explore_every)
        self.look = min(look, self.explore_every)
        self.margin = margin
        self.window = window
        #: (speculative, size class) -> the last rounds' (seconds, tokens a request)
        self.rounds: dict[tuple[bool, int], deque[tuple[float, float]]] = {}
        self._runs: dict[int, tuple[bool, int]] = {}       # size class -> (kind, rounds in a row)
        self._plan: dict[int, list[bool]] = {}             # size class -> the next rounds' kinds
        self._best: dict[int, tuple[bool, int]] = {}       # size class -> (the faster kind, gap)

    @staticmethod
    def size_class(batch: int) -> int:
        return 1 << max(0, batch - 1).bit_length()

    def rate(self, speculative: bool, size: int) -> float | None:
        """Seconds a token a request (a plain step's time; a speculative round's over the tokens
        it gives each request) at a size class, or None before its first sample."""
        rounds = self.rounds.get((speculative, size))
        if not rounds:
            return None
        cut = (len(rounds) + 3) // 4 if len(rounds) >= 3 else 0  # the slowest quarter
        kept = sorted(rounds, key=lambda r: r[0])[:len(rounds) - cut]
        return sum(sec for sec, _ in kept) / sum(tok for _, tok in kept)

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

    def speculate(self, batch: int) -> tuple[bool, bool]:
        """(whether the next round at this batch size drafts, whether it will be a sample)."""
        size = self.size_class(batch)
        plan = self._plan.setdefault(size, [])
        spec, plain = self.rate(True, size), self.rate(False, size)
        kind, run = self._runs.get(size, (None, 0))
        if plan:
            choice = plan.pop(0)
        elif spec is None or plain is None:
            choice = spec is None
            plan.extend([choice] * (self.look - 1))
        else:
            # speculating must win by the margin, to start and to take over: its samples leave out
            # what it costs besides (rounds that catch the draft up, the first rounds after a
            # prompt, requests that advance unevenly and so need rounds after the batch thins);
            # plain steps take over as soon as they are the faster
            best, gap = self._best.get(size, (spec < plain * (1 - self.margin), self.explore_every))
            choice = not plain < spec if best else spec < plain * (1 - self.margin)
            if best != choice:
                gap = self.explore_every
            if kind == choice and run >= gap - self.look:
                choice = not choice
                plan.extend([choice] * (self.look - 1))
                gap = min(2 * gap, self.max_gap)
            self._best[size] = (not choice if plan else choice, gap)
        run = run + 1 if kind == choice else 1
        self._runs[size] = (choice, run)
        return choice, run > 1
