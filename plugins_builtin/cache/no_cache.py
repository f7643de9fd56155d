"""The `no-cache` policy: a request's blocks return to the pool, forgotten, when it ends."""
from __future__ import annotations

from deepinfer.plugins import CachePolicy


class NoCache(CachePolicy):
    """Reuses nothing across requests; the default cache policy."""

    name = "no-cache"
    # (policies that keep blocks for reuse: asking for them and for no reuse at once is a mistake)
    excludes = ("prefix-cache", "swa-replay")
