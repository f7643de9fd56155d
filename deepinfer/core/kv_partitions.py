"""One KV pool made of several ranges of blocks, one a data-parallel rank: rank r's KV cache holds
blocks ``r * blocks_per_part`` .. ``(r + 1) * blocks_per_part - 1`` (as its blocks 0..), and every block
of a request comes from one range, so its KV lives on one rank. The engine's capacity is the ranks'
pools together."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from deepinfer.core.block_pool import Block, BlockPool
from deepinfer.core.interfaces import CachePolicy, PrefixMatch
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.request import Request


class PoolSet:
    """The ranges seen as one pool for what looks at the whole (gauges, usage, evict listeners); blocks
    are taken from and given back to a range (``PartitionedKV.pool_for``)."""

    def __init__(self, parts: Sequence[BlockPool]) -> None:
        self.parts = list(parts)
        self.block_size = parts[0].block_size
        self.num_blocks = sum(p.num_blocks for p in parts)
        self.blocks = [b for p in parts for b in p.blocks]

    @property
    def num_free_blocks(self) -> int:
        return sum(p.num_free_blocks for p in self.parts)

    @property
    def num_evicted(self) -> int:
        return sum(p.num_evicted for p in self.parts)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def add_evict_listener(self, fn: Callable[[Block], None]) -> None:
        for p in self.parts:
            p.add_evict_listener(fn)

    def check_all_free(self) -> None:
        for p in self.parts:
            p.check_all_free()


class PartitionedKV(KVCacheManager):
    """A KV-cache manager over ``num_parts`` ranges of ``blocks_per_part`` blocks: a request takes its
    first blocks from the range with the most free blocks and every later one from the same range,
    until it frees them (finished, preempted). ``part_of`` says which range (rank) a request is on."""

    def __init__(self, blocks_per_part: int, num_parts: int, block_size: int,
                 policies: Sequence[CachePolicy]) -> None:
        parts = [BlockPool(blocks_per_part, block_size, first_id=r * blocks_per_part) for r in range(num_parts)]
        super().__init__(PoolSet(parts), policies)  # type: ignore[arg-type] (a pool for what reads the whole)
        self.parts = parts
        self.blocks_per_part = blocks_per_part
        self._part: dict[str, int] = {}  # request id -> its range, while it holds blocks

    def part_of(self, request: Request) -> int:
        """The request's range: where its blocks are, or for one without blocks the range with the
        most free blocks (the lowest of equals)."""
        part = self._part.get(request.request_id)
        if part is None:
            part = max(range(len(self.parts)), key=lambda r: (self.parts[r].num_free_blocks, -r))
        return part

    def pool_for(self, request: Request) -> BlockPool:
        return self.parts[self.part_of(request)]

    def allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        part = self.part_of(request)
        self._part[request.request_id] = part  # (fixed for the whole call: it changes the free counts)
        done = super().allocate(request, num_new_tokens, match)
        if not request.block_ids:
            self._part.pop(request.request_id, None)
        return done

    def free(self, request: Request) -> None:
        super().free(request)
        self._part.pop(request.request_id, None)
