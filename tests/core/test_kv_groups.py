"""KV group 1 (sliding-window layers in a pool of their own): step slots, window release, and
refusal of a policy match that lacks the window. Oracle: counted blocks and slots."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.block_pool import BlockPool
from deepinfer.core.interfaces import PrefixMatch
from deepinfer.core.kv_manager import KVCacheManager, SlidingKV
from deepinfer.core.request import Request
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.step_batch import build_step_batch


def _manager(window: int = 10, full: int = 32, sliding: int = 16, bs: int = 4) -> KVCacheManager:
    return KVCacheManager(BlockPool(full, bs), [], SlidingKV(BlockPool(sliding, bs), window))


def test_replayed_tokens_write_no_full_attention_kv_and_every_sliding_kv():
    # one sequence computing positions 6..9, full-attention KV cached below 8 (a replay of 6, 7)
    batch = build_step_batch([([1, 2, 3, 4], 6, [5, 6, 7])], 4, torch.device("cpu"),
                             sliding=[([9, 2, 3], 8)])
    full, sliding = batch.kv_groups
    assert full.slot_mapping.tolist() == [-1, -1, 7 * 4 + 0, 7 * 4 + 1]
    assert full.write_rows.tolist() == [2, 3]
    assert sliding.slot_mapping.tolist() == [2 * 4 + 2, 2 * 4 + 3, 3 * 4 + 0, 3 * 4 + 1]
    assert sliding.write_rows is None and sliding.block_tables.tolist() == [[9, 2, 3]]
    assert batch.slot_mapping is full.slot_mapping and batch.block_tables is full.block_tables


def test_blocks_behind_the_window_go_back_to_the_pool_and_read_the_null_block():
    kv, window, bs = _manager(window=10), 10, 4
    req = Request("r", list(range(100, 160)), SamplingParams())
    peak = 0
    while req.num_computed_tokens < 60:
        n = min(6, 60 - req.num_computed_tokens)
        assert kv.allocate(req, n)
        req.num_computed_tokens += n
        kv.on_computed(req)
        live = kv.num_live_sliding_blocks(req)
        peak = max(peak, live)
        first_needed = max(0, req.num_computed_tokens - window + 1) // bs
        table = req.sliding_block_ids
        assert all(b == kv.sliding.null_block_id for b in table[:first_needed])
        assert kv.sliding.null_block_id not in table[first_needed:]
        assert kv.sliding.pool.num_free_blocks == kv.sliding.pool.num_blocks - live
    assert peak <= -(-window // bs) + 2
    assert len(kv.blocks_of(req)) == 15  # full-attention layers keep every token
    kv.free(req)
    kv.pool.check_all_free()
    kv.sliding.pool.check_all_free()
    assert req.sliding_block_ids == [] and req.replay_until == 0


def test_a_short_sliding_pool_refuses_the_allocation():
    kv = _manager(sliding=3)
    req = Request("r", list(range(40)), SamplingParams())
    assert not kv.allocate(req, 16)  # 4 sliding blocks needed, 3 in the pool
    assert kv.pool.num_free_blocks == kv.pool.num_blocks and req.block_ids == []


def test_a_match_without_the_window_it_resumes_in_is_refused():
    kv = _manager(window=10)

    class Careless:
        def match(self, request, previous):
            return PrefixMatch(kv.pool.blocks[:3], 12)  # no sliding-window blocks for 12

    kv.policies.append(Careless())
    with pytest.raises(RuntimeError, match="resumed at token 12 with 0 sliding-window blocks; resuming there "
                                           "needs 3"):
        kv.match_prefix(Request("r", list(range(20)), SamplingParams()))


def test_a_request_that_wants_prompt_logprobs_resumes_from_nothing_whatever_a_policy_answers():
    """Prompt logprobs need every prompt position computed: the manager drops a policy's match (a
    third party's policy might not check) but still asks every policy (an admission's hook)."""
    asked = []

    class Everything:
        def match(self, request, previous):
            asked.append(request.request_id)
            return PrefixMatch([object()], 4)

    kv = KVCacheManager(BlockPool(8, 4), [Everything()])
    assert kv.match_prefix(Request("a", list(range(9)), SamplingParams())).num_tokens == 4
    assert kv.match_prefix(Request("b", list(range(9)), SamplingParams(prompt_logprobs=0))) == PrefixMatch([], 0)
    assert asked == ["a", "b"]
