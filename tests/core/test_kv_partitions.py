"""The KV pool of data-parallel ranks: every block of a request comes from one rank's range of block
ids, the range with the most free blocks when it first takes blocks; the capacity is the ranges'
together (counted invariants on 2 ranges of 4 blocks of 4 tokens)."""
from __future__ import annotations

from deepinfer.core.kv_partitions import PartitionedKV
from deepinfer.core.request import Request
from deepinfer.core.sampling_params import SamplingParams


def _request(rid: str, n: int) -> Request:
    return Request(rid, list(range(n)), SamplingParams())


def test_a_request_grows_within_its_range_and_the_next_one_takes_the_emptier_range():
    kv = PartitionedKV(4, 2, 4, [])
    a, b = _request("a", 6), _request("b", 6)
    assert kv.allocate(a, 6) and kv.allocate(b, 6)
    assert a.block_ids == [0, 1] and b.block_ids == [4, 5]
    a.num_computed_tokens = 6
    assert kv.allocate(a, 4)  # (10 tokens: a third block, from a's range though b's has as many free)
    assert a.block_ids == [0, 1, 2] and kv.part_of(a) == 0 and kv.part_of(b) == 1
    assert kv.pool.num_free_blocks == 3 and kv.pool.num_blocks == 8


def test_the_capacity_is_every_range_but_a_request_fits_in_one():
    kv = PartitionedKV(4, 2, 4, [])
    assert not kv.can_allocate(_request("long", 20), 20)  # (5 blocks: more than one rank holds)
    a, b = _request("a", 16), _request("b", 16)
    assert kv.allocate(a, 16) and kv.allocate(b, 16)  # (4 blocks each: the whole of both ranges)
    assert kv.usage == 1.0
    assert not kv.allocate(_request("c", 1), 1)


def test_freed_blocks_go_back_to_their_range_and_a_preempted_request_may_move():
    kv = PartitionedKV(4, 2, 4, [])
    a, b, c = _request("a", 4), _request("b", 12), _request("c", 4)
    assert kv.allocate(a, 4) and kv.allocate(b, 12)  # (a on range 0; b on range 1, 3 blocks)
    kv.preempt(a)
    assert kv.parts[0].num_free_blocks == 4 and not a.block_ids
    assert kv.allocate(c, 4) and kv.part_of(c) == 0 and c.block_ids[0] < 4  # (range 0: the most free blocks)
    assert kv.allocate(a, 4) and kv.part_of(a) == 0 and a.block_ids[0] < 4  # (range 0's 3 free beat range 1's 1)
    for r in (a, b, c):
        kv.free(r)
    kv.pool.check_all_free()
