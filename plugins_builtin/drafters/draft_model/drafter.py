"""The `draft-model` drafter: a small model with the target's tokenizer proposes k tokens."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Drafter, DraftProposal, Request
from deepinfer_builtin.drafters.draft_model.runner import DraftRunner

DEMO_TARGET = "demo-target"


def default_draft_dir(target_dir: str | None) -> str | None:
    """The demo draft when the target is the demo model (they ship side by side)."""
    if target_dir is None:
        return None
    p = Path(target_dir).resolve()
    if p.name == DEMO_TARGET and (p.parent / "demo-draft" / "config.json").is_file():
        return str(p.parent / "demo-draft")
    return None


def draft_blocks(ctx) -> int:
    """Enough draft KV for max_num_seqs sequences of max_model_len tokens (the draft's KV is
    small, but the target's pool may already have taken nearly all device memory), at most as
    many blocks as the target's pool."""
    cfg = ctx.config
    per_seq = -(-(cfg.max_model_len or ctx.model_config.get("max_model_len", 2048)) // cfg.block_size) + 1
    return min(ctx.kv.pool.num_blocks, cfg.max_num_seqs * per_seq)


def draft_dtype(ctx, requested: str):
    """The draft model's torch dtype for the option ``dtype`` (see DraftModelOptions)."""
    import torch

    if requested != "auto":
        return getattr(torch, requested)
    return ctx.device.draft_dtype(ctx.dtype)


class DraftModelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="draft model directory (default: the demo draft for the demo target)")
    num_speculative_tokens: int = Field(5, ge=1, le=16)
    num_blocks: int | None = Field(None, ge=1, description="draft KV blocks (default: max_num_seqs full-length "
                                                            "sequences, at most the target's block count)")
    loop_graph: bool = Field(True, description="with device graphs, replay a greedy round's k draft steps from "
                                               "one graph (one launch and one copy to the host a round)")
    device_drafts: bool = Field(True, description="the loop graph's drafts stay on the device, where the "
                                                  "verification step reads them: the host prepares that step "
                                                  "while the draft runs, and waits once a round, not twice")
    chain_rounds: bool = Field(True, description="with the loop graph and device drafts, on a device that runs queued "
                                                 "work asynchronously: queue each round's draft steps right behind "
                                                 "the verification of the last, their first inputs computed on the "
                                                 "device from the verified tokens, before the host has read them")
    sampled_drafts: Literal["sampled", "greedy"] = Field(
        "sampled", description="how sampled requests are drafted: sampled: each draft drawn from the draft's "
                               "distribution under the request's temperature and filters (more drafts "
                               "accepted); greedy: the draft's argmax, as for greedy requests (verified as "
                               "deterministic drafts; with the loop graph, the greedy one)")
    sampled_loop: bool = Field(True, description="with the loop graph and sampled drafts, rounds with sampled "
                                                 "requests replay loop graphs of their own too (two more captured "
                                                 "sets: with filters that sort the logits and without; on CPU and "
                                                 "CUDA devices, for batches whose logits fit 2^24 entries); else "
                                                 "they draft step by step")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the draft model's dtype (weights and its KV cache); auto: the device's choice "
                            "(Device.draft_dtype): the target's, except that the cpu device gives a "
                            "half-precision target a float32 draft unless deepinfer's bfloat16 kernel runs "
                            "its steps or (bfloat16) the CPU has AVX-512 (elsewhere torch's half-precision "
                            "single-token matmuls are no faster)")
    compile: bool | None = Field(None, description="compile the draft's one-token steps of a single "
                                                   "sequence with torch.compile (needs a C++ compiler; without "
                                                   "one they run eagerly); default: on the CPU, where steps "
                                                   "run eagerly (CUDA devices replay graphs instead), unless "
                                                   "batch_invariant (its attention's loop over key chunks "
                                                   "recompiles as sequences grow)")


class DraftModelDrafter(Drafter):
    """Runs the draft model inside the engine with its own paged KV; proposes k tokens a step."""

    name = "draft-model"
    Options = DraftModelOptions

    def __init__(self, options: DraftModelOptions, ctx) -> None:
        super().__init__(options, ctx)
        model = options.model or default_draft_dir(ctx.model_path)
        if model is None:
            raise ValueError(f"{self.name}: no draft model given and the target ({ctx.model_path}) is not the "
                             f"demo model; set plugin_options {{'{self.name}': {{'model': DIR}}}}")
        compile_steps = options.compile if options.compile is not None else \
            ctx.device.torch_device.type == "cpu" and not ctx.config.batch_invariant
        self.runner = DraftRunner(ctx, model, options.num_blocks or draft_blocks(ctx), draft_dtype(ctx, options.dtype),
                                  compile_steps, greedy_sampled=options.sampled_drafts == "greedy")
        self.k = options.num_speculative_tokens

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    #: new tokens a sequence the loop graph's first step takes (DraftLoopGraphs)
    loop_first = 2

    def enable_graphs(self, graphs, batch_sizes, max_seq_len) -> None:
        loop_steps = self.k if self.options.loop_graph and self.k > 1 else 0
        sampled_loop = self.options.sampled_loop and self.options.sampled_drafts == "sampled"
        self.runner.enable_graphs(graphs, batch_sizes, max_seq_len, loop_steps, self.loop_first, sampled_loop)

    def propose(self, requests: list[Request]) -> dict[str, DraftProposal]:
        drafts = self.runner.propose(list(requests), self.k, lazy=self.options.device_drafts)
        return {rid: DraftProposal(d.tokens, d.probs, source=d.source) for rid, d in drafts.items()}

    def on_verified(self, verified, best, best_host) -> None:
        if self.options.chain_rounds and self.options.device_drafts:
            self.runner.chain(verified, best, best_host, self.k)

    def release(self, request: Request) -> None:
        self.runner.release(request.request_id)
