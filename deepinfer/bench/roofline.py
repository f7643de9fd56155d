"""Lower bounds on time from measured device ceilings: bytes moved for decode, FLOPs for prefill."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.bench.workloads import Workload


@dataclass(frozen=True, slots=True)
class Ceiling:
    bandwidth: float   # bytes/s, device-to-device copy (read + written)
    bf16_flops: float  # FLOP/s, large bf16 matmul


# measured on 2026-11-29, see ../shared/BENCHMARKS.md
CEILINGS = {"NVIDIA H200": Ceiling(4.23e12, 804e12)}


def device_ceiling(device: torch.device) -> tuple[str, Ceiling | None]:
    if device.type != "cuda":
        return device.type, None
    name = torch.cuda.get_device_name(device)
    return name, next((c for key, c in CEILINGS.items() if name.startswith(key)), None)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    params: int
    weight_bytes: int
    kv_bytes_per_token: int
    attn_flops_per_token_pair: int  # QK^T and PV for one (query, key) pair over all layers

    @classmethod
    def of(cls, engine) -> ModelFacts:
        model = engine.runner.model
        params = sum(p.numel() for p in model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        size = torch.empty((), dtype=engine.ctx.dtype).element_size()
        layers = engine.ctx.layers
        kv = sum(2 * s.num_kv_heads * s.head_dim * size for s in layers)
        attn = sum(4 * s.num_heads * s.head_dim for s in layers)
        return cls(params, weight_bytes, kv, attn)


def decode_bytes(facts: ModelFacts, wl: Workload) -> float:
    """All weights once per step plus the KV every sequence reads, summed over the decode steps
    (steps = the longest output; sequences leave as they finish)."""
    steps = max(wl.output_lens)
    total = steps * facts.weight_bytes
    for prompt, out in zip(wl.prompts, wl.output_lens, strict=True):
        total += facts.kv_bytes_per_token * (out * len(prompt) + out * (out - 1) / 2)
    return total


def prefill_flops(facts: ModelFacts, wl: Workload) -> float:
    """2 x parameters per token, plus causal attention over each prompt."""
    total = 0.0
    for prompt in wl.prompts:
        n = len(prompt)
        total += 2 * facts.params * n + facts.attn_flops_per_token_pair * n * (n + 1) / 2
    return total


def bound_seconds(engine, wl: Workload, kind: str) -> float | None:
    """The roofline time of the workload on this device (None: no measured ceiling for it)."""
    _, ceiling = device_ceiling(engine.runner.device)
    if ceiling is None:
        return None
    facts = ModelFacts.of(engine)
    if kind == "prefill":
        return prefill_flops(facts, wl) / ceiling.bf16_flops
    return decode_bytes(facts, wl) / ceiling.bandwidth


def describe(engine, wl: Workload, measured_s: float, kind: str) -> str:
    """One line: the roofline time for this workload on this device and the share reached."""
    name, ceiling = device_ceiling(engine.runner.device)
    if ceiling is None:
        known = ", ".join(CEILINGS)
        return f"roofline: no measured ceiling for {name} (known: {known})"
    facts = ModelFacts.of(engine)
    if kind == "prefill":
        flops = prefill_flops(facts, wl)
        bound = flops / ceiling.bf16_flops
        return (f"roofline ({name}): {flops / 1e12:.1f} TFLOP at {ceiling.bf16_flops / 1e12:.0f} TFLOP/s "
                f"-> {bound * 1e3:.1f} ms; measured {measured_s * 1e3:.1f} ms = {100 * bound / measured_s:.1f}% "
                f"model FLOP utilisation")
    moved = decode_bytes(facts, wl)
    bound = moved / ceiling.bandwidth
    tokens = sum(wl.output_lens)
    return (f"roofline ({name}): {moved / 1e9:.2f} GB at {ceiling.bandwidth / 1e12:.2f} TB/s -> "
            f"{tokens / bound:,.0f} output tok/s; measured {tokens / measured_s:,.0f} = "
            f"{100 * bound / measured_s:.1f}% (prefill time included in the measurement)")
