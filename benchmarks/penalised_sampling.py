"""Sampling with penalties: rows adjusted in a copy of the logits and sampled with the
others (``Sampler.sample_batch``, session 52) against each such row sampled on its own on the host
(``Sampler._sample_row``, as before), in one process.

    python benchmarks/penalised_sampling.py [--requests 64] [--output-len 64] [--turns 2] [--device cpu]

The demo target decodes ``--requests`` prompts of 64 tokens (held-out standard-library files, as
bench spec's) at once, ``--output-len`` new tokens each, at temperature 0.8 with a repetition
penalty of 1.1 and each filter below (seeded), then with a presence penalty of 0.5 and top-p 0.9;
the two ways take turns: tok/s.
"""
from __future__ import annotations

import argparse
import time

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts
from deepinfer.core.sampler import Sampler, batchable

CASES = {"repetition 1.1": {"repetition_penalty": 1.1},
         "repetition 1.1, top-p 0.9": {"repetition_penalty": 1.1, "top_p": 0.9},
         "repetition 1.1, top-k 50": {"repetition_penalty": 1.1, "top_k": 50},
         "presence 0.5, top-p 0.9": {"presence_penalty": 0.5, "top_p": 0.9}}
batched_call = Sampler.__call__
batched_on_device = Sampler.sample_on_device


def one_by_one_call(self, logits, requests):
    """Session 51's routing: rows with penalties or a held-back EOS sampled one by one on the host,
    the others together (requests without logprobs)."""
    logits = logits.float()
    apart = [i for i, r in enumerate(requests) if not batchable(r)]
    together = [i for i in range(len(requests)) if i not in set(apart)]
    tokens = [0] * len(requests)
    if together:
        drawn = self.sample_batch(logits[together], [requests[i] for i in together]).tolist()
        for i, t in zip(together, drawn, strict=True):
            tokens[i] = t
    for i in apart:
        tokens[i] = self._sample_row(logits[i].clone(), requests[i])
    return tokens, [None] * len(requests)


def one_by_one_on_device(self, logits, requests, out=None):
    if all(batchable(r) for r in requests):
        return batched_on_device(self, logits, requests, out)
    return torch.tensor(one_by_one_call(self, logits, requests)[0], dtype=torch.long, device=logits.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="a device plugin (the GPU host: sm90)")
    a = ap.parse_args()
    llm = LLM(progress=False, device=a.device, plugins=[])
    reqs = [{"prompt_token_ids": p} for p in stdlib_prompts(llm.get_tokenizer(), a.requests, 64)]
    llm.generate(reqs[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    ways = {"batched": (batched_call, batched_on_device), "one by one": (one_by_one_call, one_by_one_on_device)}
    print("| case | batched tok/s | one by one tok/s |\n| --- | --- | --- |")
    for name, kw in CASES.items():
        rates: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(a.turns):
            for way, (call, on_device) in ways.items():
                Sampler.__call__, Sampler.sample_on_device = call, on_device
                params = SamplingParams(temperature=0.8, max_tokens=a.output_len, ignore_eos=True, seed=7, **kw)
                start = time.perf_counter()
                outs = llm.generate(reqs, params, use_tqdm=False)
                elapsed = time.perf_counter() - start
                rates[way].append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
        Sampler.__call__, Sampler.sample_on_device = batched_call, batched_on_device
        cells = [", ".join(f"{r:,.1f}" for r in rates[w]) for w in ways]
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
