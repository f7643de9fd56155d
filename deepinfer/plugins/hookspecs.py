"""Hook specifications: observers and small adjustments around the engine's life and steps.

A plugin implements any of these with ``@deepinfer.plugins.hookimpl``, taking only the
arguments it needs; the engine calls them by keyword.
"""
from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("deepinfer")
hookimpl = pluggy.HookimplMarker("deepinfer")


@hookspec
def deepinfer_config_finalized(config: Any) -> None:
    """The EngineConfig is complete and validated; plugins are about to be built."""


@hookspec
def deepinfer_model_loaded(model: Any) -> None:
    """The target model is loaded on its device, before the KV cache is sized and graphs are
    captured. A plugin uses what the model offers through its optional capabilities
    (``CountsExpertLoad``, ``PlacesExperts``), nothing else of it. (Hook plugins only: slot plugins
    are registered later.)"""


@hookspec
def deepinfer_register_metrics(metrics: Any) -> None:
    """Declare counters and gauges (``metrics.counter(name, help)``) before the engine starts."""


@hookspec
def deepinfer_engine_started(engine: Any) -> None:
    """The engine is assembled and ready for requests."""


@hookspec
def deepinfer_engine_stopped(engine: Any) -> None:
    """The engine is shutting down."""


@hookspec
def deepinfer_step_begin(engine: Any) -> None:
    """A step is about to be scheduled."""


@hookspec
def deepinfer_step_end(engine: Any, num_tokens: int) -> None:
    """A step finished after computing ``num_tokens`` tokens: its tokens are appended and the
    requests it finished are done, but its outputs are not built yet (the text of requests without
    stop strings, the request-finished hooks and the gauges come after; with a drafter, so does
    the next step's proposal)."""


@hookspec
def deepinfer_request_added(request_id: str, num_prompt_tokens: int) -> None:
    """A request entered the waiting queue."""


@hookspec
def deepinfer_request_finished(request_id: str, output: Any) -> None:
    """A request finished normally; ``output`` is its final RequestOutput."""


@hookspec
def deepinfer_request_aborted(request_id: str) -> None:
    """A request was aborted and its blocks freed."""
