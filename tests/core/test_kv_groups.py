"""KV groups: how the layers are grouped and each group's pool sized, and group 1 (sliding-window
layers in a pool of their own): step slots, window release, and refusal of a policy match that
lacks the window. Oracle: counted blocks, bytes and slots."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.block_pool import BlockPool
from deepinfer.core.capabilities import SeparatesWindowedKV
from deepinfer.core.config import EngineConfig
from deepinfer.core.context import EngineContext
from deepinfer.core.eager_batch import build_step_batch
from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec, CachePolicy, PrefixMatch
from deepinfer.core.kv_groups import build_kv_cache, kv_group_specs
from deepinfer.core.kv_manager import KVCacheManager, SlidingKV
from deepinfer.core.metrics import Metrics
from deepinfer.core.request import Request
from deepinfer.core.sampling_params import SamplingParams


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


# -------------------------------------------------------------------------------- grouping, sizing
LAYERS = [AttentionLayerSpec(i, 4, 2, 8, sliding_window=10 if i % 2 else None) for i in range(4)]


def test_every_layer_shares_group_0_unless_the_windowed_layers_are_kept_apart():
    (only,) = kv_group_specs(LAYERS, False, 4, 64, 16)
    assert [s.layer_idx for s in only.layers] == [0, 1, 2, 3] and only.max_live_blocks == 16
    full, windowed = kv_group_specs(LAYERS, True, 4, 64, 16)
    assert [s.layer_idx for s in full.layers] == [0, 2] and {s.kv_group for s in full.layers} == {0}
    assert [s.layer_idx for s in windowed.layers] == [1, 3] and {s.kv_group for s in windowed.layers} == {1}


def test_a_windowed_group_holds_one_window_and_one_step_of_blocks_per_request():
    # window 10 and steps of up to 16 tokens: 25 positions, 7 blocks of 4, one more where they straddle
    assert kv_group_specs(LAYERS, True, 4, 64, 16)[1].max_live_blocks == 8
    assert kv_group_specs(LAYERS, True, 4, 12, 16)[1].max_live_blocks == 4  # (no request is longer than 12)


class _Attention(AttentionBackend):
    """100 bytes a layer per block; a layer's cache is (layer index, blocks)."""

    name = "bytes"

    def kv_cache_bytes_per_block(self, layers, block_size, dtype):
        return 100 * len(layers)

    def allocate_kv_cache(self, layers, num_blocks, block_size, dtype, device):
        return [(s.layer_idx, num_blocks) for s in layers]

    def build_metadata(self, batch):
        raise NotImplementedError

    def forward(self, layer, q, k, v, kv_cache, metadata):
        raise NotImplementedError


class _Windowed(CachePolicy, SeparatesWindowedKV):
    name = "windowed"

    def __init__(self, blocks: int) -> None:
        self.blocks = blocks

    def windowed_pool_blocks(self, group, shared_blocks):
        return self.blocks


class _Device:
    torch_device = torch.device("cpu")

    def kv_cache_budget(self, model_bytes):
        return 40_000 - model_bytes


def _build(windowed_blocks: int | None, **config):
    ctx = EngineContext(config=EngineConfig(block_size=4, max_num_batched_tokens=16, **config), metrics=Metrics(),
                        device=_Device())
    policies = [] if windowed_blocks is None else [_Windowed(windowed_blocks)]
    groups = kv_group_specs(LAYERS, bool(policies), 4, 64, 16)
    ctx.layers = [s for g in groups for s in g.layers]
    ctx.layers.sort(key=lambda s: s.layer_idx)
    return build_kv_cache(ctx, groups, _Attention(None, ctx), policies, torch.float32, 0, 64)


def test_one_pool_takes_the_whole_budget_without_a_windowed_group():
    kv, caches = _build(None)
    assert kv.sliding is None and kv.pool.num_blocks == 100  # 40,000 bytes / (4 layers * 100)
    assert caches == [(i, 100) for i in range(4)]


def test_the_full_attention_pool_gets_what_the_windowed_pool_and_its_null_block_leave():
    kv, caches = _build(19)
    assert kv.sliding.pool.num_blocks == 19 and kv.sliding.bytes_per_block == 200 and kv.sliding.window == 10
    assert kv.pool.num_blocks == (40_000 - 20 * 200) // 200
    assert caches == [(0, 180), (1, 20), (2, 180), (3, 20)]


def test_with_num_kv_blocks_the_full_attention_pool_has_exactly_that_many():
    kv, _ = _build(19, num_kv_blocks=30)
    assert kv.pool.num_blocks == 30 and kv.sliding.pool.num_blocks == 19


def test_a_windowed_pool_smaller_than_one_request_needs_is_refused_naming_the_policy():
    with pytest.raises(ValueError, match=r"sliding-window KV pool has 7 blocks of 4 tokens; one request needs 8 "
                                         r".*cache policy 'windowed' sizes it"):
        _build(7)
