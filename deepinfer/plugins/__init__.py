"""The public plugin API: everything a plugin (built-in or third-party) may import from deepinfer.

A plugin subclasses one of the slot interfaces below, declares an ``Options`` pydantic model if
it takes options, and is registered as an entry point in its slot's group (see ``SLOTS``).
"""
from deepinfer.core.block_pool import Block, BlockPool
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
    PrefixMatch,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from deepinfer.core.request import Request, RequestStatus
from deepinfer.core.sampler import draw_rows, sample_rows
from deepinfer.core.spec import accept_greedy
from deepinfer.core.step import KVGroupBatch, StepBatch
from deepinfer.core.step_batch import build_step_batch
from deepinfer.plugins.discovery import PluginError
from deepinfer.plugins.hookspecs import hookimpl

__all__ = [
    "GREEDY",
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
    "KVGroupBatch",
    "NoOptions",
    "PluginError",
    "PrefixMatch",
    "Request",
    "RequestStatus",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "StepBatch",
    "accept_greedy",
    "build_step_batch",
    "distributions",
    "draw_rows",
    "hookimpl",
    "needs_sort",
    "sample_rows",
    "sampling_rows",
]
