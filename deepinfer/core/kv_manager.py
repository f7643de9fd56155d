"""Per-request block tables over the block pools, with the cache-policy stack consulted."""
from __future__ import annotations

from collections.abc import Sequence

from deepinfer.core.block_pool import Block, BlockPool
from deepinfer.core.interfaces import CachePolicy, PrefixMatch
from deepinfer.core.request import Request, RequestStatus


class SlidingKV:
    """KV group 1: the sliding-window layers' own pool. A request holds only the blocks its window
    still reads; the ones behind it go back to the pool (a cache policy may keep them cached), and
    their table entries point at ``null_block_id``, a zeroed block outside the pool never written."""

    def __init__(self, pool: BlockPool, window: int) -> None:
        self.pool = pool
        self.window = window
        self.null_block_id = pool.num_blocks
        self.bytes_per_block = 0  # set by the composition root

    def window_start(self, num_computed: int) -> int:
        """First position the next token (at ``num_computed``) attends to."""
        return max(0, num_computed - self.window + 1)


class KVCacheManager:
    """Gives requests the blocks their tokens need; cache policies decide reuse and release."""

    def __init__(self, pool: BlockPool, policies: Sequence[CachePolicy], sliding: SlidingKV | None = None) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.policies = list(policies)
        self.sliding = sliding
        self._blocks: dict[str, list[Block]] = {}
        self._sliding_blocks: dict[str, list[Block | None]] = {}  # None: released (behind the window)
        self._released: dict[str, int] = {}  # table entries before this are released

    def pool_for(self, request: Request) -> BlockPool:
        """The pool the request's blocks come from (one pool here; ``PartitionedKV``: its rank's range)."""
        return self.pool

    def blocks_of(self, request: Request) -> list[Block]:
        return self._blocks.get(request.request_id, [])

    def sliding_blocks_of(self, request: Request) -> list[Block | None]:
        """The request's sliding-window table (None where released); empty without KV group 1."""
        return self._sliding_blocks.get(request.request_id, [])

    def match_prefix(self, request: Request) -> PrefixMatch:
        """Ask the policy stack which cached blocks the request can start from (no references taken).
        Nothing for a request that wants prompt logprobs, whatever a policy answers (every prompt
        position must be computed); the policies are asked all the same (an admission's hook)."""
        match = PrefixMatch([], 0)
        for policy in self.policies:
            match = policy.match(request, match)
        if request.params.prompt_logprobs is not None and match.num_tokens:
            return PrefixMatch([], 0)
        if self.sliding is not None and match.num_tokens:
            self._check_window(match)
        return match

    def _check_window(self, match: PrefixMatch) -> None:
        bs, n = self.block_size, match.num_tokens
        need = n // bs - self.sliding.window_start(n) // bs
        if n % bs or len(match.window_blocks) != need:
            raise RuntimeError(f"a cache policy resumed at token {n} with {len(match.window_blocks)} "
                               f"sliding-window blocks; resuming there needs {need} and a block boundary")

    def _total(self, request: Request, num_new_tokens: int, match: PrefixMatch | None) -> int:
        return request.num_computed_tokens + (match.num_tokens if match else 0) + num_new_tokens

    def num_blocks_needed(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> int:
        have = len(self._blocks.get(request.request_id, ())) + (len(match.blocks) if match else 0)
        return max(0, -(-self._total(request, num_new_tokens, match) // self.block_size) - have)

    def _sliding_needed(self, request: Request, num_new_tokens: int, match: PrefixMatch | None) -> int:
        have = len(self._sliding_blocks.get(request.request_id, ()))
        if match is not None and match.num_tokens:
            have += match.num_tokens // self.block_size
        return max(0, -(-self._total(request, num_new_tokens, match) // self.block_size) - have)

    def can_allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        need = self.num_blocks_needed(request, num_new_tokens, match)
        # matched blocks sitting in the free queue stop being free once we take them
        revived = sum(1 for b in match.blocks if b.ref_cnt == 0) if match else 0
        if need + revived > self.pool_for(request).num_free_blocks:
            return False
        if self.sliding is None:
            return True
        need = self._sliding_needed(request, num_new_tokens, match)
        revived = sum(1 for b in match.window_blocks if b.ref_cnt == 0) if match else 0
        return need + revived <= self.sliding.pool.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Reserve blocks for ``num_new_tokens`` more tokens (after taking ``match``); False if short."""
        if match is None and self.sliding is None:  # a running request's step: most need no block
            need = self.num_blocks_needed(request, num_new_tokens)
            if need:
                pool = self.pool_for(request)
                if need > pool.num_free_blocks:
                    return False
                new = pool.allocate(need)
                self._blocks.setdefault(request.request_id, []).extend(new)
                request.block_ids = request.block_ids + [b.block_id for b in new]
            return True
        if not self.can_allocate(request, num_new_tokens, match):
            return False
        blocks = self._blocks.setdefault(request.request_id, [])
        if match is not None and match.blocks:
            self.pool_for(request).touch(match.blocks)
            blocks.extend(match.blocks)
        if match is not None:
            if self.sliding is not None and match.num_tokens:
                self._start_window(request, match)
            request.num_computed_tokens += match.num_tokens
            request.replay_until = match.replay_until
            if request.num_cached_tokens < 0:  # (its first admission: what the cache gave it)
                request.num_cached_tokens = match.num_tokens
        need = self.num_blocks_needed(request, num_new_tokens)
        if need:
            blocks.extend(self.pool_for(request).allocate(need))
        request.block_ids = [b.block_id for b in blocks]
        if self.sliding is not None:
            table = self._sliding_blocks.setdefault(request.request_id, [])
            new = self.sliding.pool.allocate(self._sliding_needed(request, num_new_tokens, None))
            table.extend(new)
            request.sliding_block_ids.extend(b.block_id for b in new)
        return True

    def _start_window(self, request: Request, match: PrefixMatch) -> None:
        self.sliding.pool.touch(match.window_blocks)
        released = match.num_tokens // self.block_size - len(match.window_blocks)
        table: list[Block | None] = [None] * released + list(match.window_blocks)
        self._sliding_blocks[request.request_id] = table
        self._released[request.request_id] = released
        null = self.sliding.null_block_id
        request.sliding_block_ids = [null if b is None else b.block_id for b in table]

    def on_computed(self, request: Request) -> None:
        """Tell the policies that the request's KV now covers ``num_computed_tokens`` tokens, then
        release the sliding-window blocks no later token attends to."""
        blocks = self._blocks.get(request.request_id)
        if blocks:
            for policy in self.policies:
                policy.on_computed(request, blocks)
        if self.sliding is not None:
            self._release_behind_window(request)

    def _release_behind_window(self, request: Request) -> None:
        rid = request.request_id
        table = self._sliding_blocks.get(rid)
        if not table:
            return
        end = min(len(table), self.sliding.window_start(request.num_computed_tokens) // self.block_size)
        start = self._released.get(rid, 0)
        if end <= start:
            return
        gone = [b for b in table[start:end] if b is not None]
        table[start:end] = [None] * (end - start)
        request.sliding_block_ids[start:end] = [self.sliding.null_block_id] * (end - start)
        self._released[rid] = end
        self.sliding.pool.free(gone)

    def num_live_sliding_blocks(self, request: Request) -> int:
        return sum(1 for b in self._sliding_blocks.get(request.request_id, ()) if b is not None)

    def free(self, request: Request) -> None:
        """Release the request's blocks; the policies choose what stays cached."""
        blocks = self._blocks.pop(request.request_id, None) or []
        request.block_ids = []
        for policy in self.policies:
            policy.on_free(request, blocks)
        # tail first, so a request's tail is evicted before its head
        self.pool_for(request).free(reversed(blocks))
        if self.sliding is not None:
            table = self._sliding_blocks.pop(request.request_id, None) or []
            self._released.pop(request.request_id, None)
            self.sliding.pool.free(b for b in reversed(table) if b is not None)
        request.sliding_block_ids = []
        request.replay_until = 0

    def preempt(self, request: Request) -> None:
        """A scheduler's victim: release its blocks and reset it to be computed again from its first
        token (it keeps the tokens it generated). The scheduler only chooses the victim and queues it
        again; this is the one place the reset lives."""
        self.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1

    @property
    def usage(self) -> float:
        return self.pool.usage
