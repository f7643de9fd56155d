"""A deepinfer CLI command with sampling as it was before a session's change (an A/B in one call).

    python3 benchmarks/sampling_variant.py [--before 43|44] -- <deepinfer arguments, e.g. bench spec --temperature 0.8 ...>

``--before 44`` (the default): speculative rounds of sampled requests as session 43 left them, one
request at a time on the host: each draft token drawn from its row's distribution copied to the
host (and that distribution kept there), and each request verified on its own, on the host
(``verify_batch`` one request at a time over its rows copied to the CPU). Plain sampled steps keep
``Sampler.sample_batch``.

``--before 43``: also every sampled row of a plain step on the host, one by one
(``Sampler._sample_row``: a step of sampled requests then waits for its tokens, no overlap), and
every draw of the sampler and the draft an exponential race over the whole
distribution (argmax of p / E, E ~ Exp(1)) instead of the inverse CDF of one uniform number.
"""
import sys

import torch

import deepinfer.core.sampler
import deepinfer.core.spec
import deepinfer_builtin.drafters.draft_model.runner
from deepinfer.cli import main
from deepinfer.core.sampler import draw, filter_logits

args = sys.argv[1:sys.argv.index("--")]
before = int(args[args.index("--before") + 1]) if "--before" in args else 44
if before not in (43, 44):
    sys.exit(f"--before takes 43 or 44, not {before}")
batched_verify = deepinfer.core.spec.verify_batch


def race(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


def draft_per_row(rows, logits):
    """Session 43's draft draws: each row filtered, copied to the host and drawn there."""
    tokens, probs = [], []
    for (req, seq), row in zip(rows, logits, strict=True):
        p = req.params
        q = filter_logits(row / p.temperature, p.effective_top_k, p.top_p, p.min_p).softmax(-1).cpu()
        tokens.append((race if before == 43 else draw)(q, seq.generator))
        probs.append(q)
    return torch.tensor(tokens), torch.stack(probs)


def verify_per_request(logits, items, generator):
    """Each request verified on its own over its rows on the host, as session 43 did."""
    out, at = [], 0
    for item in items:
        n = len(item[1]) + 1
        out += batched_verify(logits[at:at + n].cpu(), [item], generator)
        at += n
    return out


deepinfer_builtin.drafters.draft_model.runner.DraftRunner._sample = staticmethod(draft_per_row)
deepinfer.core.spec.verify_batch = verify_per_request  # (the runner imports it at each verification)
if before == 43:
    deepinfer.core.sampler.draw = race
    deepinfer.core.sampler.batch_device = lambda logits: False  # (looked up at each step: rows one by one)
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
