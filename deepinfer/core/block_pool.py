"""Fixed-size KV blocks, their reference counts, and the free queue (least recently used first)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free."""


@dataclass(slots=True)
class Block:
    """One block of the paged KV cache: an id, its users, and the key a cache policy gave it."""

    block_id: int
    ref_cnt: int = 0
    block_hash: Any = None  # set by a cache policy while the block's contents are reusable
    token_ids: tuple[int, ...] | None = None


class BlockPool:
    """Owns every KV block; hands out free ones, evicting cached ones least recently used first.

    A block whose reference count drops to zero joins the tail of the free queue but keeps its
    hash, so a cache policy can revive it; allocation takes from the head. When a block that still
    carries a hash is taken, ``on_evict`` listeners learn of it before the hash is cleared.
    """

    def __init__(self, num_blocks: int, block_size: int, first_id: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(first_id + i) for i in range(num_blocks)]  # (first_id: one range of a larger pool)
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._evict_listeners: list[Callable[[Block], None]] = []
        self.num_evicted = 0

    def add_evict_listener(self, fn: Callable[[Block], None]) -> None:
        self._evict_listeners.append(fn)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, n: int) -> list[Block]:
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} KV blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                for fn in self._evict_listeners:
                    fn(block)
                block.block_hash = None
                block.token_ids = None
                self.num_evicted += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block, reviving it from the free queue if needed."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference on each block; blocks reaching zero join the free queue's tail,
        so the first block given here is the first to be evicted among them."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def check_all_free(self) -> None:
        """Raise unless every block is free (cached blocks count as free: nobody holds them)."""
        held = [b.block_id for b in self.blocks if b.ref_cnt != 0]
        if held or len(self._free) != self.num_blocks:
            raise AssertionError(
                f"{len(held)} blocks still referenced ({held[:10]}...), "
                f"{len(self._free)}/{self.num_blocks} in the free queue"
            )
