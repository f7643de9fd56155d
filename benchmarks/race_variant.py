"""A deepinfer CLI command with the samplers drawing as they did before session 43: an exponential
race over the whole distribution (argmax of p / E, E ~ Exp(1)), in the sampler, the rejection
sampler and the draft's sampled drafts, instead of ``sampler.draw``'s inverse CDF (an A/B in one
device call).

    python3 benchmarks/race_variant.py -- <deepinfer arguments, e.g. bench spec --temperature 0.8 ...>
"""
import sys

import torch

import deepinfer.core.sampler
import deepinfer.core.spec
import deepinfer_builtin.draft_runner
from deepinfer.cli import main


def race(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


for module in (deepinfer.core.sampler, deepinfer.core.spec, deepinfer_builtin.draft_runner):
    module.draw = race  # each module calls the name it imported (or defines)
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
