"""The public plugin API: everything a plugin (built-in or third-party) may import from deepinfer.

A plugin subclasses one of the slot interfaces below, declares an ``Options`` pydantic model if
it takes options, and is registered as an entry point in its slot's group (see ``SLOTS``).
"""
from deepinfer.core.block_pool import Block, BlockPool, NoFreeBlocksError
from deepinfer.core.context import EngineContext
from deepinfer.core.filters import GREEDY, distributions, needs_sort, sampling_rows
from deepinfer.core.graphs import DecodeGraphs
from deepinfer.core.host_copy import HostCopy
from deepinfer.core.interfaces import (
    AttentionBackend,
    AttentionLayerSpec,
    CachePolicy,
    Device,
    DeviceGraphs,
    DeviceTokens,
    Drafter,
    DraftProposal,
    NoOptions,
    Plugin,
    PrefixMatch,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from deepinfer.core.kv_manager import KVCacheManager, SlidingKV
from deepinfer.core.metrics import Metrics
from deepinfer.core.request import Request, RequestStatus
from deepinfer.core.sampler import draw, draw_rows, filter_logits, sample_rows
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.spec import accept_greedy
from deepinfer.core.step import KVGroupBatch, StepBatch
from deepinfer.core.step_batch import build_step_batch
from deepinfer.plugins.discovery import PluginError, PluginInfo, discover, load
from deepinfer.plugins.groups import SLOTS, Slot
from deepinfer.plugins.hookspecs import hookimpl

# isort: split
# optional capabilities of a slot's plugins (deepinfer.core.capabilities), the device's fused kernels, KV groups
from deepinfer.core.capabilities import FusedKVWrite, HandlesSingleRuns, Rests, SeparatesWindowedKV, SkipsRounds
from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.kv_groups import KVGroupSpec

__all__ = [
    "GREEDY",
    "SLOTS",
    "AttentionBackend",
    "AttentionLayerSpec",
    "Block",
    "BlockPool",
    "CachePolicy",
    "DecodeGraphs",
    "Device",
    "DeviceGraphs",
    "DeviceTokens",
    "DraftProposal",
    "Drafter",
    "EngineContext",
    "HostCopy",
    "KVCacheManager",
    "KVGroupBatch",
    "Metrics",
    "NoFreeBlocksError",
    "NoOptions",
    "Plugin",
    "PluginError",
    "PluginInfo",
    "PrefixMatch",
    "Request",
    "RequestStatus",
    "SamplingParams",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "SlidingKV",
    "Slot",
    "StepBatch",
    "accept_greedy",
    "build_step_batch",
    "discover",
    "distributions",
    "draw",
    "draw_rows",
    "filter_logits",
    "hookimpl",
    "load",
    "needs_sort",
    "sample_rows",
    "sampling_rows",
]
__all__ += [
    "FusedKVWrite",
    "FusedOps",
    "HandlesSingleRuns",
    "KVGroupSpec",
    "Rests",
    "SeparatesWindowedKV",
    "SkipsRounds",
]
