"""Where the router sends a request: the instance most likely to hold its prefix, unless that one is
busier than the least loaded by more than a threshold; or round robin, to compare against."""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def prefix_chain(body: dict[str, Any], chunk_chars: int) -> list[bytes]:
    """Chained hashes of a request's prompt in pieces of ``chunk_chars`` characters (whole pieces
    only), its ``cache_salt`` at the root: two requests share a leading run of hashes exactly where
    their prompts share a prefix that long, as instances' prefix caches share blocks."""
    if "messages" in body:  # each message as one line of JSON: a later turn extends an earlier one
        text = "".join(json.dumps([m.get("role"), m.get("content")], ensure_ascii=False) + "\n"
                       for m in body.get("messages") or [] if isinstance(m, dict))
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)[:-1]  # token ids: no closing ]
    data = text.encode()
    salt = body.get("cache_salt")
    parent = hashlib.blake2b(f"salt:{salt}".encode() if salt else b"", digest_size=16).digest()
    out = []
    for i in range(len(data) // chunk_chars):
        parent = hashlib.blake2b(parent + data[i * chunk_chars:(i + 1) * chunk_chars], digest_size=16).digest()
        out.append(parent)
    return out


class PrefixIndex:
    """Which prefix hashes one instance was sent, least recently used first, bounded."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[bytes, None] = OrderedDict()

    def matched(self, chain: Sequence[bytes]) -> int:
        n = 0
        for h in chain:
            if h not in self.entries:
                break
            n += 1
        return n

    def insert(self, chain: Sequence[bytes]) -> None:
        for h in chain:
            self.entries[h] = None
            self.entries.move_to_end(h)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


class CacheAware:
    """The longest prefix match wins, ties to the least loaded; but the least loaded instance is
    chosen instead when the winner's load (requests in flight) exceeds it by more than
    ``threshold``, or when what it holds beyond the runner-up covers at most ``min_match`` of the
    prompt (a chat template's opening alone: every instance soon holds that, and new conversations
    should spread)."""

    name = "cache-aware"

    def __init__(self, num_instances: int, threshold: int = 4, min_match: float = 0.25,
                 max_entries: int = 1 << 20) -> None:
        self.indexes = [PrefixIndex(max_entries) for _ in range(num_instances)]
        self.threshold, self.min_match = threshold, min_match
        self.turn = 0  # ties between equally loaded instances go round robin from here

    def choose(self, chain: Sequence[bytes], loads: Sequence[int]) -> int:
        n = len(loads)
        matched = [ix.matched(chain) for ix in self.indexes]
        best = max(range(n), key=lambda i: (matched[i], -loads[i], -((i - self.turn) % n)))
        least = min(range(n), key=lambda i: (loads[i], (i - self.turn) % n))
        runner_up = max((m for i, m in enumerate(matched) if i != best), default=0)
        pick = best
        if matched[best] - runner_up <= self.min_match * len(chain) or loads[best] - loads[least] > self.threshold:
            pick = least
            self.turn = (least + 1) % n
        self.indexes[pick].insert(chain)
        return pick


class RoundRobin:
    """Each instance in turn, whatever the prompt."""

    name = "round-robin"

    def __init__(self, num_instances: int, **_: Any) -> None:
        self.n, self.next = num_instances, 0

    def choose(self, chain: Sequence[bytes], loads: Sequence[int]) -> int:
        pick, self.next = self.next, (self.next + 1) % self.n
        return pick


POLICIES = {p.name: p for p in (CacheAware, RoundRobin)}
