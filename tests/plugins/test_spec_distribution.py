"""End to end, sampled requests that speculate keep the target's distribution: a target and a draft
whose next-token distributions are fixed (p and q, whatever the context), many seeded requests
through the engine, and the tokens they generate tested by chi-square, alone and in pairs."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from tests.core.test_spec_verify import _chi2
from tests.tiny_models import constant_model

pytestmark = pytest.mark.slow  # 2,000 seeded requests end to end

P = [0.6, 0.1, 0.1, 0.2]  # the target's distribution over its first four tokens
Q = [0.1, 0.5, 0.2, 0.2]  # the draft's: far from p, and its tokens of unequal probability
#: chi-square at p = 0.001 by degrees of freedom
CRITICAL = {3: 16.27, 15: 37.70}
REQUESTS = 2000
TOKENS = 6  # three pairs a request: (t0, t1), (t2, t3), (t4, t5)


@pytest.fixture(scope="module")
def fixed_pair(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("p"), tmp_path_factory.mktemp("q")
    model = constant_model(target, P)
    constant_model(draft, Q, seed=1)
    with torch.no_grad():  # the oracle: transformers gives p after any context
        probs = model(torch.tensor([[5, 9, 3, 0, 2]])).logits[0].softmax(-1)
    assert torch.allclose(probs[:, :4], torch.tensor(P).expand(5, 4), atol=1e-5)
    return str(target), str(draft)


@pytest.mark.parametrize("drafter", ["draft-model", "deepspark"])
def test_sampled_tokens_follow_the_target_distribution_with_drafts(drafter, fixed_pair):
    """Each generated token is drawn from p, independently of the one before, whatever the draft
    proposed and whichever of its drafts the drafter chose to verify. Two ways it went wrong: the
    draft drew its tokens with the request's own seed, so its draws repeated the numbers that had
    drawn the request's tokens (pairs off); and deepspark chose the drawn drafts to verify from
    their own probability under q, so that drafts of some tokens were never tested (marginal off).
    With q's tokens at three probabilities and a threshold between them, deepspark's rule has
    something to choose from."""
    target, draft = fixed_pair
    opts = {"deepspark": {"lookup": False, "skip_when_slower": "never", "cost_aware": False, "min_value": 0.12}}
    llm = LLM(target, dtype="float32", plugins=[drafter], max_num_seqs=64, progress=False,
              plugin_options={drafter: {"model": draft, **opts.get(drafter, {})}})
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=TOKENS, ignore_eos=True) for i in range(REQUESTS)]
    outs = llm.generate([{"prompt_token_ids": [5, 6, 7]}] * REQUESTS, params, use_tqdm=False)
    tokens = torch.tensor([o.outputs[0].token_ids for o in outs])
    assert tokens.shape == (REQUESTS, TOKENS) and int(tokens.max()) < len(P)
    m = llm.get_metrics()
    verified, accepted = m["deepinfer:spec_decode_num_verified_tokens"], m["deepinfer:spec_decode_num_accepted_tokens"]
    assert verified > REQUESTS and 0 < accepted < verified  # drafts were verified, and some rejected
    p = torch.tensor(P, dtype=torch.float64)
    chi2, dof = _chi2(torch.bincount(tokens.flatten(), minlength=len(P)), p)
    assert chi2 < CRITICAL[dof], ("tokens", chi2, torch.bincount(tokens.flatten()))
    pairs = tokens.reshape(-1, 2)
    counts = torch.bincount(pairs[:, 0] * len(P) + pairs[:, 1], minlength=len(P) ** 2)
    chi2, dof = _chi2(counts, torch.outer(p, p).flatten())
    assert chi2 < CRITICAL[dof], ("pairs", chi2, counts.reshape(len(P), len(P)))
    llm.engine.kv.pool.check_all_free()
    llm.engine.drafter.runner.draft.pool.check_all_free()
