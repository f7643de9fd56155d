"""Optional capabilities: a plugin without one gets the behaviour the old defaults gave, the
built-ins declare the ones they have, and the CUDA devices' fused kernels match the FusedOps
protocol. Oracles: counted calls on fakes, and the protocol's own signatures."""
from __future__ import annotations

import inspect

import pytest

from deepinfer.core.capabilities import FusedKVWrite, HandlesSingleRuns, Rests, SeparatesWindowedKV, SkipsRounds
from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import Drafter
from deepinfer.core.metrics import Metrics
from deepinfer.core.request import Request
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.core.speculation import Speculation


class _Quiet(Drafter):
    """Drafts nothing, ever; counts its proposals."""

    name = "quiet"

    def __init__(self) -> None:
        self.proposals = 0

    def propose(self, requests):
        self.proposals += 1
        return {}


class _Resting(_Quiet, SkipsRounds, Rests):
    skips_rounds = True

    def needs_tokens(self, requests) -> bool:
        return False

    def rests_above(self) -> int | None:
        return 1


class _Scheduler:
    num_waiting, num_running = 0, 1


def _propose(drafter: Drafter, steps: int = 3) -> list[str]:
    """``steps`` proposals for one decoding request, each with a step left running; what happened."""
    spec, req, taken = Speculation(drafter, _Scheduler(), Metrics()), Request("r", [1, 2], SamplingParams()), []
    for _ in range(steps):
        spec.propose(lambda: [req], lambda: taken.append("take"))
    return taken


def test_a_drafter_without_skips_rounds_gets_the_running_step_taken_before_each_proposal():
    assert not isinstance(_Quiet(), SkipsRounds)
    assert _propose(_Quiet()) == ["take"] * 3


def test_a_drafter_without_rests_is_asked_at_every_step():
    quiet = _Quiet()
    _propose(quiet, steps=4)
    assert quiet.proposals == 4


def test_a_drafter_that_skips_and_rests_keeps_the_step_running_and_is_not_asked_while_it_rests():
    resting = _Resting()
    assert isinstance(resting, SkipsRounds) and isinstance(resting, Rests)
    assert _propose(resting, steps=4) == [] and resting.proposals == 1


def test_the_built_in_plugins_declare_exactly_the_capabilities_they_have():
    from deepinfer_builtin.attention.torch_attn import TorchAttention
    from deepinfer_builtin.attention.triton_attn import TritonAttention
    from deepinfer_builtin.cache.prefix_cache import PrefixCache
    from deepinfer_builtin.cache.swa_replay import SwaReplay
    from deepinfer_builtin.drafters.deepspark.drafter import DeepSparkDrafter
    from deepinfer_builtin.drafters.draft_model.drafter import DraftModelDrafter
    from deepinfer_builtin.drafters.ngram import NgramDrafter

    capabilities = (SkipsRounds, Rests, HandlesSingleRuns, FusedKVWrite, SeparatesWindowedKV)
    has = {cls.__name__: {c.__name__ for c in capabilities if c in cls.__mro__}
           for cls in (TorchAttention, TritonAttention, PrefixCache, SwaReplay, DeepSparkDrafter,
                       DraftModelDrafter, NgramDrafter)}
    assert has == {"TorchAttention": set(), "TritonAttention": {"HandlesSingleRuns", "FusedKVWrite"},
                   "PrefixCache": set(), "SwaReplay": {"SeparatesWindowedKV"},
                   "DeepSparkDrafter": {"SkipsRounds", "Rests"}, "DraftModelDrafter": set(), "NgramDrafter": set()}


def _members(proto: type) -> dict[str, inspect.Signature | None]:
    """The protocol's members: a method's signature, or None for a data member."""
    names = set(getattr(proto, "__annotations__", {})) | {n for n, v in vars(proto).items() if callable(v)
                                                           and not n.startswith("_")}
    return {n: inspect.signature(getattr(proto, n)) if callable(getattr(proto, n, None)) else None for n in names}


def _accepts(impl: inspect.Signature, spec: inspect.Signature) -> list[str]:
    """What a call made by ``spec``'s parameters would find missing in ``impl`` (empty: none)."""
    params = impl.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    wanted = [p for name, p in spec.parameters.items() if name != "self"]
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    missing = [p.name for p in wanted if p.name not in params]
    order = [p.name for p in wanted if p.kind is p.POSITIONAL_OR_KEYWORD]
    if [p.name for p in positional[:len(order)]] != order:
        missing.append(f"positional order {order}")
    return missing


def test_the_cuda_fused_kernels_offer_every_fused_op_with_the_protocol_signature():
    kernels = pytest.importorskip("deepinfer_kernels")
    ops = kernels.FusedOps()
    for name, spec in _members(FusedOps).items():
        assert getattr(ops, name, None) is not None, name
        if spec is not None:
            assert _accepts(inspect.signature(getattr(ops, name)), spec) == [], name
