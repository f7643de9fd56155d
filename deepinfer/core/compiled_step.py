"""A second model's one-token step compiled with torch.compile, for devices whose steps run
eagerly (the CPU): a draft model's (``SecondModel.compile_steps``).

There a small draft's step costs mostly the launch of its few hundred small torch ops, not its
arithmetic: the demo draft's step (2 layers, hidden 256, an 8,192-token LM head) took 2.4 ms
eagerly and 1.35 ms compiled on this project's CPU (session 19). Inductor's ``cpp_wrapper`` mode
calls the compiled kernels and the custom ops from generated C++ instead of a Python wrapper: on
the AVX-512 machine the step took 457 us with it against 793 us without (session 38).

The compiled step computes one sequence's new token through the model, the LM head and the
softmax, and returns the greedy token, its probability and the logits (float32), from which a
sampled request's draft is drawn outside the compiled code; the number of keys it reads is a
dynamic dimension, so one compilation serves every length. Its inputs are built for the one sequence (by the attention's
``sequence_metadata``), not through a StepBatch. Other steps (three tokens or more, several
sequences) run eagerly. Inductor needs a C++ compiler: without one, or if the step fails to
compile for any other reason, the model's steps run eagerly and the reason is logged and kept in
``failed``.

Once ``warm_up`` has compiled both kinds of step, calls take torch.compile's
``skip_guard_eval_unsafe`` stance, which checks only part of the guards: the global state (grad
mode, default dtype), every tensor input's match (the inputs, the metadata's tensors, the KV
caches, the rotary tables) and whatever tells the two compilations apart (the inputs' size [1] or
[2], a mask or none). It skips the guards on the weights (Parameters), on attributes and constants,
and the symbolic shape guards. The full check cost 0.3-0.8 ms a call in a microbenchmark (2.3-2.8
ms against about 2.0, session 28). This is sound because nothing skipped can change between calls:
``covers`` admits only these two kinds of step, of one sequence after at least one cached token
(the shape guards ask for at least two keys); the model, its weights and attributes are the same
objects every call; the number of keys is the dynamic dimension both were compiled for; and the
metadata's slot tensors have strides that follow from their lengths alone (each window's slice is
made before the batch dimension is added: ``TorchAttention.sequence_metadata``). The stance is
process-wide while it lasts, so it is taken only where the caller left torch.compile's
default stance, and the engine steps from one thread. Calls outside inference mode (which the
warm-up compiled in) check every guard.
"""
from __future__ import annotations

import logging
import types

import numpy as np
import torch
import torch._dynamo.exc

from deepinfer.core.block_pool import BlockPool

log = logging.getLogger("deepinfer")


class CompiledStep:
    """A second model's one-token step for a batch of one, compiled on first use (``warm_up``
    compiles it ahead, on a block of the model's pool that it frees again)."""

    def __init__(self, model, attention, kv_caches: list, block_size: int, device: torch.device) -> None:
        self.model, self.attention, self.kv_caches = model, attention, kv_caches
        self.block_size, self.device = block_size, device
        self.failed: str | None = None
        self.warm = False  # both kinds of step compiled (warm_up): calls may skip guards (module docstring)
        # a code object of its own: torch.compile keeps its compilations per code object, and up to
        # 8 of them; engines of one process (each draft a new instance) would share and exhaust them
        fn = CompiledStep._step_fn
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
        # (cpp_wrapper: the compiled code calls its kernels and ops from C++, not from a Python
        # wrapper; the demo draft's step took 457 against 793 us, session 38, compiling no slower)
        self._step = torch.compile(types.MethodType(own, self), fullgraph=True, options={"cpp_wrapper": True})

    @staticmethod
    def supported(attention) -> bool:
        """Whether this attention backend builds one sequence's metadata (``sequence_metadata``) and
        can mark its lengths dynamic."""
        return hasattr(attention, "mark_dynamic") and hasattr(attention, "sequence_metadata")

    def covers(self, feeds: list[tuple[list[int], int, list[int]]]) -> bool:
        """A step of one sequence with one or two new tokens (two: a round's first step after its
        last draft was accepted) after at least one cached one (a single key would be a dimension
        of size 1, which the compiler specialises)."""
        return self.failed is None and len(feeds) == 1 and len(feeds[0][0]) <= 2 and feeds[0][1] >= 1

    def _step_fn(self, input_ids, positions, kv_caches, meta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.model(input_ids, positions, kv_caches, meta)
        logits = self.model.compute_logits(hidden[-1:]).float()
        prob, token = logits.softmax(-1).max(-1)
        return prob, token, logits

    def run(self, feeds: list[tuple[list[int], int, list[int]]]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(probability, token, logits) after the feed's last token: the greedy token and its
        probability, each [1], and the float32 logits [1, vocab]; None if it failed to compile (the
        caller then runs the step eagerly: nothing was written)."""
        tokens, start, block_ids = feeds[0]
        end, bs = start + len(tokens), self.block_size
        keys = np.arange(end)  # every key's slot, then the attention's metadata of that one sequence
        slots = torch.from_numpy(np.asarray(block_ids, dtype=np.int64)[keys // bs] * bs + keys % bs)
        meta = self.attention.sequence_metadata(slots.to(self.device), len(tokens))
        self.attention.mark_dynamic(meta)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(start, end, device=self.device)
        try:
            if self.warm and torch.is_inference_mode_enabled() and _default_stance():
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._step(ids, positions, self.kv_caches, meta)
            return self._step(ids, positions, self.kv_caches, meta)
        except (RuntimeError, OSError, torch._dynamo.exc.FailOnRecompileLimitHit) as e:
            # (a missing compiler, a step it refused, or too many compilations); run eagerly from now on
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("the draft model's compiled step failed (%s); its steps run eagerly", self.failed)
            return None

    def warm_up(self, pool: BlockPool, token: int = 0) -> None:
        """Compile now, both kinds of step (one token, two): at the third slot of a block taken from
        the model's pool (its first two hold whatever they held; nothing reads them), then the
        block goes back."""
        blocks = pool.allocate(1)
        try:
            with torch.inference_mode():  # as the steps run: compiled code is kept per grad mode
                for n in (1, 2):
                    self.run([([token] * n, 2, [b.block_id for b in blocks])])
            self.warm = self.failed is None
        finally:
            pool.free(blocks)


def _default_stance() -> bool:
    """Whether torch.compile runs in its default stance (a caller's "force_eager" or
    "fail_on_recompile" must not be replaced); False where this torch does not say."""
    stance = getattr(torch._dynamo.eval_frame, "_stance", None)
    return getattr(stance, "stance", None) == "default" and not getattr(stance, "skip_guard_eval_unsafe", True)
