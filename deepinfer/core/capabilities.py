"""Optional capabilities: what a plugin of some slot may also do, beyond its slot's interface.

A plugin has a capability when it has the protocol's members (subclassing the protocol too says so
where a reader looks first). The core asks for one with ``isinstance(plugin, Capability)`` once, when
the engine is assembled, and otherwise behaves as if the plugin lacked it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from deepinfer.core.interfaces import AttentionLayerSpec
    from deepinfer.core.kv_groups import KVGroupSpec
    from deepinfer.core.request import Request


# ---------------------------------------------------------------------------------------- drafter
@runtime_checkable
class SkipsRounds(Protocol):
    """A drafter that says before each proposal whether it will draft, so that the engine may keep
    overlap scheduling on: it leaves the previous step running for a round that drafts nothing.
    Without it, the engine plans each step only after the previous one has finished."""

    @property
    def skips_rounds(self) -> bool:
        """Whether ``needs_tokens`` may answer False here (as configured); False: as without it."""
        ...

    def needs_tokens(self, requests: Sequence[Request]) -> bool:
        """Asked before ``propose`` while the previous step still runs and some request decodes:
        whether that proposal needs the requests' latest tokens on the host (a request's last token
        may still be pending, ``Request.num_pending``). True: the engine takes that step first.
        False promises that the ``propose`` right after drafts nothing (it gets the same requests,
        tokens pending; the engine refuses drafts then), and the step stays running."""
        ...


@runtime_checkable
class Rests(Protocol):
    """A drafter that may promise to draft nothing for a while, so that the engine skips its
    proposals (and their list of decoding sequences) until something changes."""

    def rests_above(self) -> int | None:
        """Asked after a proposal that drafted nothing: n promises that the drafter would draft
        nothing for the sequences decoding then, or any of them, while at least n of them run, none
        waits and no request is added; the engine (where every running sequence was decoding and
        none waited) then skips the proposal until a request is added, one waits (a preemption) or
        fewer than n run. None: no promise."""
        ...


# -------------------------------------------------------------------------------------- attention
@runtime_checkable
class HandlesSingleRuns(Protocol):
    """An attention backend that, in graphs of several query rows per sequence (speculative
    verification), gives the sequences flagged in ``StepBatch.single_runs`` what it gives a
    one-token run in an eager step. Without it, verification steps with a one-token run are not
    replayed from graphs."""

    #: False: as without the capability
    handles_single_runs: bool


@runtime_checkable
class FusedKVWrite(Protocol):
    """An attention backend whose cache the device's fused qkv kernel (``FusedOps.gemv_qkv_rotary``)
    may write a step's keys and values into, saving the backend's own write."""

    def fused_kv_write(self, layer: AttentionLayerSpec, kv_cache: Any,
                       metadata: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """For a step the device's GEMVs run (one token, or a few): (k_cache, v_cache, slots [T]),
        caches [num_slots, kv_heads, D], for the fused qkv kernel to write each token's key and
        value into (a negative slot: not written); ``forward`` then gets k and v None. None: this
        step, forward writes them."""
        ...


# ----------------------------------------------------------------------------------- cache policy
@runtime_checkable
class SeparatesWindowedKV(Protocol):
    """A cache policy that keeps the model's sliding-window layers in a KV group of their own
    (``KVGroupSpec``): a pool where a request holds only the blocks its window still reads. The
    attention backend must then read per-group tables (``AttentionBackend.supports_kv_groups``),
    and steps run eagerly (device graphs replay one KV group)."""

    def windowed_pool_blocks(self, group: KVGroupSpec, shared_blocks: int) -> int:
        """Blocks of ``group``'s pool (at least ``group.max_live_blocks``); ``shared_blocks`` is
        what one pool of every layer would hold. The full-attention pool gets what is left."""
        ...
