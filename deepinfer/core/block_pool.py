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

    Blocks never taken yet head the free queue, in id order; their ``Block`` objects are made when
    first taken (a pool sized from memory holds a million blocks of a tiny model, and making them
    all up front took seconds). ``blocks`` makes every one.
    """

    def __init__(self, num_blocks: int, block_size: int, first_id: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._first_id = first_id  # (one range of a larger pool)
        self._made: list[Block] = []  # the blocks taken at least once, in id order
        self._free: OrderedDict[int, Block] = OrderedDict()  # made blocks at zero references, LRU first
        self._evict_listeners: list[Callable[[Block], None]] = []
        self.num_evicted = 0

    @property
    def blocks(self) -> list[Block]:
        """Every block, in id order (those never taken join the head of the free queue, as they were)."""
        if len(self._made) < self.num_blocks:
            fresh = [Block(self._first_id + i) for i in range(len(self._made), self.num_blocks)]
            for block in reversed(fresh):
                self._free[block.block_id] = block
                self._free.move_to_end(block.block_id, last=False)
            self._made.extend(fresh)
        return self._made

    def _take_fresh(self) -> Block:
        block = Block(self._first_id + len(self._made))
        self._made.append(block)
        return block

    def add_evict_listener(self, fn: Callable[[Block], None]) -> None:
        self._evict_listeners.append(fn)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_blocks - len(self._made)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate(self, n: int) -> list[Block]:
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(f"asked for {n} KV blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            if len(self._made) < self.num_blocks:
                block = self._take_fresh()
            else:
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
        held = [b.block_id for b in self._made if b.ref_cnt != 0]
        if held or self.num_free_blocks != self.num_blocks:
            raise AssertionError(
                f"{len(held)} blocks still referenced ({held[:10]}...), "
                f"{self.num_free_blocks}/{self.num_blocks} in the free queue"
            )
