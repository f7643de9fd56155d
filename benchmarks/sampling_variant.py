"""A deepinfer CLI command with sampling as it was before session 43 (an A/B in one device call):
every sampled row on the host, one by one (``Sampler._sample_row``: a step of sampled requests then
waits for its tokens, no overlap), each drawn by an exponential race over the whole distribution
(argmax of p / E, E ~ Exp(1)), and so are the rejection sampler's and the draft's draws, instead
of ``Sampler.sample_batch`` on the device and ``sampler.draw``'s inverse CDF.

    python3 benchmarks/sampling_variant.py -- <deepinfer arguments, e.g. bench spec --temperature 0.8 ...>
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
deepinfer.core.sampler.batchable = lambda req: False  # (the sampler looks the name up at each step)
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
