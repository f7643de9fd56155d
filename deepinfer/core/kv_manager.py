"""Per-request block tables over the block pool, with the cache-policy stack consulted."""
from __future__ import annotations

from collections.abc import Sequence

from deepinfer.core.block_pool import Block, BlockPool
from deepinfer.core.interfaces import CachePolicy, PrefixMatch
from deepinfer.core.request import Request


class KVCacheManager:
    """Gives requests the blocks their tokens need; cache policies decide reuse and release."""

    def __init__(self, pool: BlockPool, policies: Sequence[CachePolicy]) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.policies = list(policies)
        self._blocks: dict[str, list[Block]] = {}

    def blocks_of(self, request: Request) -> list[Block]:
        return self._blocks.get(request.request_id, [])

    def match_prefix(self, request: Request) -> PrefixMatch:
        """Ask the policy stack which cached blocks the request can start from (no references taken)."""
        match = PrefixMatch([], 0)
        for policy in self.policies:
            match = policy.match(request, match)
        return match

    def num_blocks_needed(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> int:
        have = len(self._blocks.get(request.request_id, ())) + (len(match.blocks) if match else 0)
        total = request.num_computed_tokens + (match.num_tokens if match else 0) + num_new_tokens
        return max(0, -(-total // self.block_size) - have)

    def can_allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        need = self.num_blocks_needed(request, num_new_tokens, match)
        # matched blocks sitting in the free queue stop being free once we take them
        revived = sum(1 for b in match.blocks if b.ref_cnt == 0) if match else 0
        return need + revived <= self.pool.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Reserve blocks for ``num_new_tokens`` more tokens (after taking ``match``); False if short."""
        if not self.can_allocate(request, num_new_tokens, match):
            return False
        blocks = self._blocks.setdefault(request.request_id, [])
        if match is not None and match.blocks:
            self.pool.touch(match.blocks)
            blocks.extend(match.blocks)
        if match is not None:
            request.num_computed_tokens += match.num_tokens
        need = self.num_blocks_needed(request, num_new_tokens)
        if need:
            blocks.extend(self.pool.allocate(need))
        request.block_ids = [b.block_id for b in blocks]
        return True

    def on_computed(self, request: Request) -> None:
        """Tell the policies that the request's KV now covers ``num_computed_tokens`` tokens."""
        blocks = self._blocks.get(request.request_id)
        if blocks:
            for policy in self.policies:
                policy.on_computed(request, blocks)

    def free(self, request: Request) -> None:
        """Release the request's blocks; the policies choose what stays cached."""
        blocks = self._blocks.pop(request.request_id, None) or []
        request.block_ids = []
        for policy in self.policies:
            policy.on_free(request, blocks)
        # tail first, so a request's tail is evicted before its head
        self.pool.free(reversed(blocks))

    @property
    def usage(self) -> float:
        return self.pool.usage
