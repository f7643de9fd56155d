"""Probe (session 43): can a draft loop graph stop early on the device, through CUDA graph
conditional (IF) nodes? Steps 2..k of the loop are captured inside nested IF nodes whose
predicates are device booleans set between replays. Reports whether torch has the API, whether
the capture works with the device's kernels (PDL included), the device time of a loop replay by
the number of steps run, and whether the steps that ran give the unconditioned loop's tokens.

    python3 benchmarks/h200_cond_probe.py [--pdl 0|1]
"""
from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager
from dataclasses import replace

import torch

from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM
from deepinfer_builtin import draft_loop

GO: list[torch.Tensor] = []


@contextmanager
def if_node(pred: torch.Tensor):
    if not torch.cuda.is_current_stream_capturing():
        yield
        return
    g = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    g.begin_capture_to_if_node(pred)
    try:
        yield
    finally:
        g.end_capture_to_conditional_node()


def conditional_work(self, batch):
    b = batch.seq_lens.shape[0]
    new = batch.seq_lens - batch.context_lens
    last = torch.arange(b, device=new.device) * self.query_len + (new.long() - 1).clamp(min=0)
    out = torch.zeros(b, 2, self.steps, device=new.device)
    p, t = self._argmax(draft_loop.DecodeGraphs.captured_work(self, batch)[last])
    out[:, 0, 0].copy_(t)
    out[:, 1, 0].copy_(p)
    one, ins = self.one._batch(b), self.inputs.device(b)

    def rest(j, tok):
        if j >= self.steps - 1:
            return
        with if_node(GO[j]):
            step = replace(one, input_ids=tok, positions=ins["step_pos"][j], slot_mapping=ins["step_slots"][j],
                           seq_lens=ins["step_lens"][j], block_tables=batch.block_tables)
            p, t = self._argmax(self.one.captured_work(step))
            out[:, 0, j + 1].copy_(t)
            out[:, 1, j + 1].copy_(p)
            rest(j + 1, t)

    rest(0, t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pdl", type=int, default=1)
    ap.add_argument("--output-len", type=int, default=128)
    a = ap.parse_args()
    C = torch.cuda.CUDAGraph
    needed = ("get_currently_capturing_graph", "begin_capture_to_if_node", "end_capture_to_conditional_node")
    if missing := [m for m in needed if not hasattr(C, m)]:  # (torch 2.11 on the H200: all three)
        raise SystemExit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) has no conditional nodes in "
                         f"its CUDA graphs: torch.cuda.CUDAGraph lacks {', '.join(missing)}")
    k = 5
    GO.extend(torch.ones((), dtype=torch.bool, device="cuda") for _ in range(k - 1))
    opts = {"sm90": {"programmatic_launch": bool(a.pdl)}}
    results = {}
    for label in ("plain", "cond"):
        if label == "cond":
            draft_loop.DraftLoopGraphs.captured_work = conditional_work
        llm = LLM(None, progress=False, device="sm90", plugins=["draft-model"], kv_cache_memory_gb=2,
                  plugin_options=opts)
        tok = llm.get_tokenizer()
        params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in stdlib_prompts(tok, 4, 64)]
        loop = llm.engine.drafter.runner.loop
        outs = []
        for p in prompts:  # batch 1, one at a time
            outs.append(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
        results[label] = outs
        print(label, "generated; equal to plain:", outs == results["plain"], flush=True)
        replay, out = loop._replays[1]
        # device time of the batch-1 loop replay on its last inputs, by steps run
        for steps in range(1, k + 1):
            for j, g in enumerate(GO):
                g.fill_(j + 1 < steps)
            torch.cuda.synchronize()
            ts = []
            for _ in range(200):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                replay()
                e1.record()
                ts.append((e0, e1))
            torch.cuda.synchronize()
            us = statistics.median(x.elapsed_time(y) * 1000 for x, y in ts)
            print(f"{label} steps {steps}: {us:.1f} us a replay; out tokens {out[0, 0].tolist()}", flush=True)
            if label == "plain":
                break
        for g in GO:
            g.fill_(True)
        del llm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
