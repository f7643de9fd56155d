"""Why a batch-1 verification's LM head takes long on the host (session 34: 144 us a call in
``h200_host_parts.py``): times the final norm and the LM head's matmul apart, on the host's clock,
inside deepspark's greedy generates, and whether the device was still busy when each began
(``torch.cuda.current_stream().query()``). Medians over the verification steps' calls.

    python3 benchmarks/h200_logits_wait.py [--drafter deepspark] [--prompts 4]
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from host_profile import demo_batch1

from deepinfer.core import host_copy
from deepinfer.models.llama import LlamaForCausalLM


def main() -> None:
    a, llm, prompts, params = demo_batch1(__doc__)
    clock = time.perf_counter
    rec: dict[str, list[float]] = {}
    busy: dict[str, list[bool]] = {}
    plain = LlamaForCausalLM.compute_logits

    def timed_logits(self, hidden):
        if hidden.shape[0] == 1 or self is not llm.engine.runner.model:
            return plain(self, hidden)
        s = torch.cuda.current_stream()
        busy.setdefault("norm", []).append(not s.query())
        t0 = clock()
        x = self.model.norm(hidden)
        t1 = clock()
        busy.setdefault("linear", []).append(not s.query())
        t2 = clock()
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        y = F.linear(x, w)
        t3 = clock()
        rec.setdefault("norm", []).append((t1 - t0) * 1e6)
        rec.setdefault("query", []).append((t2 - t1) * 1e6)
        rec.setdefault("linear", []).append((t3 - t2) * 1e6)
        return y

    plain_init = host_copy.HostCopy.__init__

    def timed_init(self, src, aside=False):
        t0 = clock()
        empty = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        t1 = clock()
        del empty
        plain_init(self, src, aside)
        t2 = clock()
        rec.setdefault("pinned empty (alone)", []).append((t1 - t0) * 1e6)
        rec.setdefault("HostCopy.__init__", []).append((t2 - t1) * 1e6)

    LlamaForCausalLM.compute_logits = timed_logits
    host_copy.HostCopy.__init__ = timed_init
    try:
        llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up
        rec.clear()
        busy.clear()
        t = clock()
        for p in prompts:
            llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
        wall = clock() - t
    finally:
        LlamaForCausalLM.compute_logits = plain
        host_copy.HostCopy.__init__ = plain_init
    print(f"{a.drafter} batch 1, {a.prompts} prompts x {a.output_len} tokens: {a.prompts * a.output_len / wall:.1f} tok/s")
    for k, v in rec.items():
        print(f"  {k:24s} {statistics.median(v):8.1f} us median, {statistics.mean(v):8.1f} mean, {len(v)} calls")
    for k, v in busy.items():
        print(f"  device busy before {k:8s} {sum(v) / max(len(v), 1):.2f} of calls")


if __name__ == "__main__":
    main()
