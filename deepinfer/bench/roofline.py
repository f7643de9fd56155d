"""Lower bounds on time from a card's ceilings: the FLOPs a prefill needs and the bytes decode moves.

Counted is the work a step needs, not the parameter count: the token-embedding table is a lookup,
the LM head runs only for the rows whose logits are sampled, routed experts only as activated, and
a sliding-window layer attends to (and reads the KV of) its window only."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from deepinfer.bench.ceilings import Ceiling, card_ceiling
from deepinfer.bench.workloads import Workload


@dataclass(frozen=True, slots=True)
class RoutedExperts:
    """A layer's routed experts: each token runs ``top_k`` of ``num_experts``."""

    num_experts: int
    top_k: int
    params_per_expert: int


@dataclass(frozen=True, slots=True)
class LayerWork:
    """One decoder layer's attention (and routed experts), as the counts need them."""

    num_heads: int
    head_dim: int            # the query/key width of a head
    kv_bytes_per_token: int  # what the layer caches a token (MLA: its latent)
    sliding_window: int | None = None
    v_head_dim: int | None = None  # the value width of a head, where it differs (MLA)
    experts: RoutedExperts | None = None

    @property
    def attn_flops_per_pair(self) -> int:
        """QK^T and PV for one (query, key) pair, all heads."""
        return 2 * self.num_heads * (self.head_dim + (self.v_head_dim or self.head_dim))


@dataclass(frozen=True, slots=True)
class ModelWork:
    """The work a model's forward does, by kind: what every token multiplies by, the LM head, the
    embedding table, the routed experts and each layer's attention."""

    dense_params: int  # layers and final norm without routed experts; no embedding table, no LM head
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    bytes_per_param: int
    layers: tuple[LayerWork, ...]

    @property
    def head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @classmethod
    def of(cls, engine) -> ModelWork:
        """The running engine's model (its parameters, config and attention layers): routed experts
        (``deepinfer.models.moe.MoE`` layers) apart from ``dense_params``; a latent layer (MLA)
        caches one row a token and reads it as key and value."""
        model = engine.runner.model
        cfg = model.config  # the core's ModelConfig, which every CausalLM keeps
        total = sum(p.numel() for p in model.parameters())
        table = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)
                    for p in m.parameters(recurse=False))
        tied, hidden, vocab = cfg.tie_word_embeddings, cfg.hidden_size, cfg.vocab_size
        size = torch.empty((), dtype=engine.ctx.dtype).element_size()
        experts = routed_experts(model)
        layers = tuple(LayerWork(s.num_heads, s.head_dim, (1 if s.latent else 2) * s.num_kv_heads * s.head_dim * size,
                                 s.sliding_window, s.value_dim, experts.get(s.layer_idx))
                       for s in engine.ctx.layers)
        routed = sum(x.num_experts * x.params_per_expert for x in experts.values())
        dense = total - table - (0 if tied else hidden * vocab) - routed
        return cls(dense, hidden, vocab, tied, size, layers)


def routed_experts(model: torch.nn.Module) -> dict[int, RoutedExperts]:
    """Each MoE layer's routed experts, by decoder layer index (from the module's name)."""
    from deepinfer.models.moe import MoE

    found = {}
    for name, m in model.named_modules():
        if isinstance(m, MoE):
            index = re.search(r"layers\.(\d+)\.", name + ".")
            if index is None:
                raise ValueError(f"the MoE module {name!r} is in no numbered layer (layers.N)")
            found[int(index.group(1))] = RoutedExperts(m.w13.shape[0], m.gate.routing.top_k,
                                                       m.w13[0].numel() + m.w2[0].numel())
    return found


def causal_pairs(n: int, window: int | None) -> int:
    """(query, key) pairs of a causal prefill of n tokens, each seeing at most ``window`` keys."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def prefill_flops(work: ModelWork, prompt_lens: Sequence[int], logit_rows: int | None = None) -> float:
    """2 x (parameters a token multiplies by) per token, the LM head for the rows it is computed
    for (default: each prompt's last token) and causal attention per layer."""
    per_token = work.dense_params + sum(x.experts.top_k * x.experts.params_per_expert
                                        for x in work.layers if x.experts is not None)
    rows = len(prompt_lens) if logit_rows is None else logit_rows
    total = 2.0 * per_token * sum(prompt_lens) + 2.0 * work.head_params * rows
    for layer in work.layers:
        total += layer.attn_flops_per_pair * sum(causal_pairs(n, layer.sliding_window) for n in prompt_lens)
    return total


def expected_union(experts: RoutedExperts, tokens: int) -> float:
    """Experts a step of ``tokens`` activates when routing is uniform (the union over its tokens)."""
    e, k = experts.num_experts, experts.top_k
    return e * (1.0 - (1.0 - k / e) ** tokens)


def step_bytes(work: ModelWork, contexts: Sequence[int],
               routed: Sequence[Sequence[Sequence[int]]] | None = None) -> float:
    """Bytes a decode step of one token per sequence moves at least: each weight tensor once (a
    tied embedding once, as the LM head; an untied table only for the rows looked up), the routed
    experts activated (``routed``: per MoE layer, each token's chosen experts; without it, the
    expected union under uniform routing), and the KV each sequence reads (``contexts``: the
    tokens each attends to, the new one included; sliding layers only their window)."""
    moe = [x.experts for x in work.layers if x.experts is not None]
    if routed is not None and len(routed) != len(moe):
        raise ValueError(f"routed names experts for {len(routed)} MoE layers; the model has {len(moe)}")
    params = work.dense_params + work.head_params
    if not work.tied_embeddings:
        params += len(contexts) * work.hidden_size
    for i, ex in enumerate(moe):
        active = expected_union(ex, len(contexts)) if routed is None else len({e for t in routed[i] for e in t})
        params += active * ex.params_per_expert
    kv = sum(b * (c if w is None else min(c, w)) for w, b in _kv_by_window(work).items() for c in contexts)
    return params * work.bytes_per_param + kv


def _kv_by_window(work: ModelWork) -> dict[int | None, int]:
    """KV bytes a token costs over the layers of each window (None: full attention)."""
    out: dict[int | None, int] = {}
    for x in work.layers:
        out[x.sliding_window] = out.get(x.sliding_window, 0) + x.kv_bytes_per_token
    return out


def decode_bytes(work: ModelWork, wl: Workload) -> float:
    """Bytes moved over the workload's steps: as many steps as the longest output (the first
    produces each request's first token), a sequence leaving once its output is done; its context
    at step j is its prompt plus j tokens."""
    total = 0.0
    for j in range(max(wl.output_lens)):
        contexts = [len(p) + j for p, out in zip(wl.prompts, wl.output_lens, strict=True) if out > j]
        total += step_bytes(work, contexts)
    return total


def _ceiling(engine) -> tuple[str, Ceiling | None]:
    return card_ceiling(engine.runner.device)


def bound_seconds(engine, wl: Workload, kind: str) -> float | None:
    """The roofline time of the workload on this device (None: a device with no ceilings, the CPU)."""
    _, ceiling = _ceiling(engine)
    if ceiling is None:
        return None
    work = ModelWork.of(engine)
    if kind == "prefill":
        return prefill_flops(work, [len(p) for p in wl.prompts]) / ceiling.bf16_flops
    return decode_bytes(work, wl) / ceiling.bandwidth


def describe(engine, wl: Workload, measured_s: float, kind: str) -> str:
    """One line: the roofline time for this workload on this device and the share reached."""
    name, ceiling = _ceiling(engine)
    if ceiling is None:
        return f"roofline: no ceilings for {name} (they are measured on CUDA cards)"
    work = ModelWork.of(engine)
    src = f"{name}, {ceiling.source}"
    if kind == "prefill":
        flops = prefill_flops(work, [len(p) for p in wl.prompts])
        bound = flops / ceiling.bf16_flops
        return (f"roofline ({src}): {flops / 1e12:.1f} TFLOP at {ceiling.bf16_flops / 1e12:.0f} TFLOP/s "
                f"-> {bound * 1e3:.1f} ms; measured {measured_s * 1e3:.1f} ms = {100 * bound / measured_s:.1f}% "
                f"model FLOP utilisation")
    moved = decode_bytes(work, wl)
    bound = moved / ceiling.bandwidth
    tokens = sum(wl.output_lens)
    return (f"roofline ({src}): {moved / 1e9:.2f} GB at {ceiling.bandwidth / 1e12:.2f} TB/s -> "
            f"{tokens / bound:,.0f} output tok/s; measured {tokens / measured_s:,.0f} = "
            f"{100 * bound / measured_s:.1f}% (prefill time included in the measurement)")
