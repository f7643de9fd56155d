"""The block pool's free queue against a plain list of every block (the queue as first written:
all blocks made up front, in id order), over random allocations, frees, revivals and evictions."""
from __future__ import annotations

import random

import pytest

from deepinfer.core.block_pool import BlockPool, NoFreeBlocksError


class ListPool:
    """The oracle: a list of free block ids, head first; references and hashes in dicts."""

    def __init__(self, n: int, first_id: int) -> None:
        self.free_ids = list(range(first_id, first_id + n))
        self.refs = dict.fromkeys(self.free_ids, 0)
        self.hashed: set[int] = set()
        self.evicted = 0

    def allocate(self, n: int) -> list[int]:
        out, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        for i in out:
            self.evicted += i in self.hashed
            self.hashed.discard(i)
            self.refs[i] = 1
        return out

    def touch(self, ids: list[int]) -> None:
        for i in ids:
            if self.refs[i] == 0:
                self.free_ids.remove(i)
            self.refs[i] += 1

    def free(self, ids: list[int]) -> None:
        for i in ids:
            self.refs[i] -= 1
            if self.refs[i] == 0:
                self.free_ids.append(i)


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_take_the_blocks_a_list_of_every_block_would(seed):
    rng = random.Random(seed)
    first = 100 * seed
    pool, oracle = BlockPool(40, 4, first_id=first), ListPool(40, first)
    evicted: list[int] = []
    pool.add_evict_listener(lambda b: evicted.append(b.block_id))
    held: list[list] = []  # allocations still referenced
    known = {}  # block id -> Block, for blocks seen so far
    for step in range(300):
        op = rng.random()
        if op < 0.45:
            n = rng.randint(1, 8)
            if n > len(oracle.free_ids):
                with pytest.raises(NoFreeBlocksError):
                    pool.allocate(n)
                continue
            got = pool.allocate(n)
            assert [b.block_id for b in got] == oracle.allocate(n), step
            for b in got:
                known[b.block_id] = b
                if rng.random() < 0.5:  # a cache policy keys it: a later taking evicts it
                    b.block_hash = ("h", b.block_id)
                    oracle.hashed.add(b.block_id)
            held.append(got)
        elif op < 0.8 and held:
            got = held.pop(rng.randrange(len(held)))
            pool.free(got)
            oracle.free([b.block_id for b in got])
        else:  # revive cached blocks from the free queue (a prefix hit), or share held ones
            ids = [i for i in oracle.hashed if i in known][:3]
            blocks = [known[i] for i in ids]
            pool.touch(blocks)
            oracle.touch(ids)
            held.append(blocks)
        assert pool.num_free_blocks == len(oracle.free_ids), step
        if step == 150:  # every block made mid-way: the order stays the list's
            assert [b.block_id for b in pool.blocks] == list(range(first, first + 40))
    assert pool.num_evicted == oracle.evicted == len(evicted)
    for got in held:
        pool.free(got)
    pool.check_all_free()


def test_a_held_block_fails_the_all_free_check():
    pool = BlockPool(1000, 16)
    first, held, third = pool.allocate(3)
    pool.free([first, third])
    with pytest.raises(AssertionError, match=r"1 blocks still referenced \(\[1\]"):
        pool.check_all_free()
    pool.free([held])
    pool.check_all_free()
    assert pool.num_free_blocks == 1000 and pool.usage == 0.0
