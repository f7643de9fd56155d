"""The public plugin API: everything a plugin (built-in or third-party) may import from deepinfer.

A plugin subclasses one of the slot interfaces below, declares an ``Options`` pydantic model if
it takes options, and is registered as an entry point in its slot's group (docs/writing-a-plugin.md).
The machinery that finds and loads plugins (``deepinfer.plugins.discovery``, ``groups``,
``selection``) is the engine's, not a plugin's.
"""
from deepinfer.core.block_pool import Block
from deepinfer.core.context import EngineContext
from deepinfer.core.interfaces import (
    AttentionBackend,
    AttentionLayerSpec,
    CachePolicy,
    Device,
    DeviceGraphs,
    Drafter,
    DraftProposal,
    NoOptions,
    PrefixMatch,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from deepinfer.core.request import Request, RequestStatus
from deepinfer.core.second_model import SecondModel
from deepinfer.core.step import KVGroupBatch, StepBatch
from deepinfer.plugins.discovery import PluginError
from deepinfer.plugins.hookspecs import hookimpl

__all__ = [
    # every plugin
    "EngineContext",       # what a plugin is built with: config, metrics, device, layers, KV manager
    "NoOptions",           # the Options model of a plugin that takes none
    "PluginError",         # raise it to refuse a configuration, with a sentence for people
    "hookimpl",            # marks a hook implementation (specs: deepinfer/plugins/hookspecs.py)
    "Request",             # one sequence: its tokens, sampling params, status and KV block ids
    "RequestStatus",       # WAITING, RUNNING, PREEMPTED, FINISHED_*
    # device
    "Device",              # the slot: torch device, availability, memory budget, optional kernels
    "DeviceGraphs",        # what Device.graphs() returns: captures a step for replay
    # attention
    "AttentionBackend",    # the slot: KV layout and allocation, per-step metadata, forward
    "AttentionLayerSpec",  # one attention layer's heads, head size, window and KV group
    "StepBatch",           # one step's flattened inputs, as build_metadata receives them
    "KVGroupBatch",        # one KV group's slots and block tables in a StepBatch (kv_groups)
    # cache policy
    "CachePolicy",         # the slot: which cached blocks a request reuses, what stays reusable
    "PrefixMatch",         # a policy's answer to match(): blocks reused and tokens they cover
    "Block",               # one block of the KV pool: id, reference count, a policy's key (block_hash)
    # drafter
    "Drafter",             # the slot: proposes draft tokens; the core verifies them
    "DraftProposal",       # one request's drafts (and the distributions they were drawn from)
    "SecondModel",         # a second model beside the target, for a drafter that runs one
    # scheduler
    "Scheduler",           # the slot: picks each step's requests and token counts
    "ScheduledRequest",    # one request of a step and how many tokens it computes
    "SchedulerOutput",     # one step's schedule: requests, preempted victims, drafts to verify
]
