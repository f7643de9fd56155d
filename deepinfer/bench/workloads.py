"""Request sets of the standard workloads (seeded, so deepinfer and the peer see the same ones)."""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def head(self, n: int) -> Workload:
        """The first n requests."""
        if n < 1:
            raise ValueError(f"a workload subset needs at least one request, got {n}")
        return Workload(self.prompts[:n], self.output_lens[:n])


def fixed(batch: int, input_len: int, output_len: int, vocab: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(input_len)] for _ in range(batch)]
    return Workload(prompts, [output_len] * batch)


def uniform(num: int, lo: int, hi: int, vocab: int, seed: int = 0) -> Workload:
    """The nano-vllm benchmark: input and output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(num):
        prompts.append([rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))])
        outs.append(rng.randint(lo, hi))
    return Workload(prompts, outs)
