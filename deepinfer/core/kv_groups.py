"""KV groups (vLLM's KV cache groups): layers that share one KV pool and one block table per
request, and the sizing and allocation of each group's pool.

Every layer is in group 0 unless a cache policy keeps the sliding-window layers apart
(``SeparatesWindowedKV``): they then form group 1, whose pool gets the blocks the policy asks for
plus a null block (what out-of-window table entries point at), and group 0 what is left of the
byte budget (with ``num_kv_blocks`` set, exactly that many).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from deepinfer.core.block_pool import BlockPool
from deepinfer.core.capabilities import SeparatesWindowedKV
from deepinfer.core.context import EngineContext
from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec, CachePolicy
from deepinfer.core.kv_manager import KVCacheManager, SlidingKV


@dataclass(frozen=True, slots=True)
class KVGroupSpec:
    """One KV group: its layers (each with ``kv_group`` = ``group_id``), their window and the most
    blocks one request holds live in the group's pool."""

    group_id: int
    layers: tuple[AttentionLayerSpec, ...]
    #: None: a request holds a block for every token it has; W: for the window of its last W
    #: tokens and the step's (the blocks behind it go back to the pool)
    sliding_window: int | None
    max_live_blocks: int


def kv_group_specs(layers: Sequence[AttentionLayerSpec], windowed_apart: bool, block_size: int,
                   max_model_len: int, max_step_tokens: int) -> tuple[KVGroupSpec, ...]:
    """Group 0: every layer, or with ``windowed_apart`` every full-attention layer (possibly none:
    its pool then holds block tables alone); group 1, with ``windowed_apart`` and sliding-window
    layers: those, with the largest window (a request holds the blocks of one window plus one
    step of up to ``max_step_tokens``, and one more where they straddle a block boundary)."""
    windowed = [s for s in layers if windowed_apart and s.sliding_window is not None]
    full = [s for s in layers if not (windowed_apart and s.sliding_window is not None)]
    groups = (KVGroupSpec(0, tuple(replace(s, kv_group=0) for s in full), None, -(-max_model_len // block_size)),)
    if windowed:
        window = max(s.sliding_window for s in windowed)
        step = min(max_model_len, window - 1 + max_step_tokens)
        groups += (KVGroupSpec(1, tuple(replace(s, kv_group=1) for s in windowed), window,
                               -(-step // block_size) + 1),)
    return groups


def windowed_policy(policies: Sequence[CachePolicy]) -> CachePolicy | None:
    """The first cache policy that keeps the sliding-window layers apart, if any."""
    return next((p for p in policies if isinstance(p, SeparatesWindowedKV)), None)


def build_kv_cache(ctx: EngineContext, groups: Sequence[KVGroupSpec], attention: AttentionBackend,
                   policies: Sequence[CachePolicy], dtype: torch.dtype, model_bytes: int,
                   max_model_len: int) -> tuple[KVCacheManager, list[Any]]:
    """Size each group's pool within the device's KV budget (or ``num_kv_blocks``), allocate every
    layer's cache (in ``ctx.layers`` order) and return the KV-cache manager over the pools."""
    config, bs = ctx.config, ctx.config.block_size
    full = groups[0]
    budget = 0 if config.num_kv_blocks else ctx.device.kv_cache_budget(model_bytes)
    shared = config.num_kv_blocks or budget // attention.kv_cache_bytes_per_block(ctx.layers, bs, dtype)
    num_blocks, windowed = shared, groups[1] if len(groups) > 1 else None
    if windowed is not None:
        policy = windowed_policy(policies)
        num_windowed = policy.windowed_pool_blocks(windowed, shared)
        _check_windowed_pool(windowed, num_windowed, policy, config.max_num_batched_tokens, bs)
        per_full = attention.kv_cache_bytes_per_block(full.layers, bs, dtype) if full.layers else 0
        per_windowed = attention.kv_cache_bytes_per_block(windowed.layers, bs, dtype)
        if not config.num_kv_blocks and per_full:
            num_blocks = (budget - (num_windowed + 1) * per_windowed) // per_full
    if num_blocks < full.max_live_blocks:
        raise ValueError(f"the KV pool has {num_blocks} blocks of {bs} tokens, fewer than one max_model_len "
                         f"({max_model_len}) request needs ({full.max_live_blocks}); give "
                         "more KV memory (num_kv_blocks, kv_cache_memory_gb) or lower max_model_len")
    tdev = ctx.device.torch_device
    by_layer = dict(zip((s.layer_idx for s in full.layers),
                        attention.allocate_kv_cache(list(full.layers), num_blocks, bs, dtype, tdev)
                        if full.layers else [], strict=True))
    sliding = None
    if windowed is not None:
        # one block more than the pool hands out: the null block of out-of-window table entries
        by_layer.update(zip((s.layer_idx for s in windowed.layers),
                            attention.allocate_kv_cache(list(windowed.layers), num_windowed + 1, bs, dtype, tdev),
                            strict=True))
        sliding = SlidingKV(BlockPool(num_windowed, bs), windowed.sliding_window)
        sliding.bytes_per_block = per_windowed
    kv = KVCacheManager(BlockPool(num_blocks, bs), policies, sliding)
    for policy in policies:
        kv.pool.add_evict_listener(policy.on_evict)
        if kv.sliding is not None:
            kv.sliding.pool.add_evict_listener(policy.on_evict)
    return kv, [by_layer[s.layer_idx] for s in ctx.layers]


def _check_windowed_pool(group: KVGroupSpec, num_blocks: int, policy: CachePolicy, max_step_tokens: int,
                         bs: int) -> None:
    if num_blocks < group.max_live_blocks:
        raise ValueError(f"the sliding-window KV pool has {num_blocks} blocks of {bs} tokens; one request "
                         f"needs {group.max_live_blocks} (its window of {group.sliding_window} plus one step of "
                         f"up to {max_step_tokens} tokens); give it more blocks (cache policy "
                         f"{policy.name!r} sizes it) or lower "
                         "max_num_batched_tokens")
