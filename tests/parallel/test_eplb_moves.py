"""EPLB under expert parallelism (gloo, 4 ranks, on the CPU): on a skewed workload (a router bias making
three of eight experts hot) a rebalance gives hot experts replicas on other ranks, the ranks exchange
expert weights to hold them, the busiest rank's share falls to within 9% of the mean, and greedy
tokens stay the single-process engine's (the oracle) across the rebalance."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer import LLM, SamplingParams
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # four ranks

#: the correction bias of the one MoE layer: experts 0, 1, 2 chosen far more often (measured: about
#: 1.6 for the static placement, 1.03 planned with 4 redundant slots)
BIAS = [0.08, 0.06, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0]
PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170)), list(range(200, 230))]
#: 8 tokens each: one step prefills the four prompts and 7 decode: a call is exactly one interval
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    path = tmp_path_factory.mktemp("skewed")
    make_model(path, "deepseek_v3", with_tokenizer=False, n_group=1, topk_group=1, vocab_size=321)
    weights = load_file(path / "model.safetensors")
    for name in weights:
        if name.endswith("e_score_correction_bias"):
            weights[name] = torch.tensor(BIAS)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return str(path)


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY,
                                                         use_tqdm=False)]


def test_a_rebalance_moves_experts_evens_the_ranks_and_keeps_the_tokens(skewed):
    one = LLM(skewed, device="cpu", dtype="float32", block_size=8, progress=False)
    want = _tokens(one)
    one.shutdown()
    ep = LLM(skewed, device="cpu", dtype="float32", block_size=8, progress=False, data_parallel_size=4,
             enable_expert_parallel=True, num_redundant_experts=4, plugins=["eplb"],
             plugin_options={"eplb": {"window": 8, "interval": 8}})
    try:
        moe = ep.engine.runner.model.moe_layers()[0]
        assert moe.slot_experts() == [0, 1, 2]  # (12 slots, 3 a rank: slot p holds expert p mod 8)
        first = _tokens(ep)  # (the rebalance runs after its last step, from its load)
        before = ep.get_metrics()
        assert before["deepinfer:eplb_rebalances"] == 1
        assert moe.physical_to_logical != [p % 8 for p in range(12)]
        hot_ranks = {p // 3 for p, e in enumerate(moe.physical_to_logical) if e == 0}
        assert len(hot_ranks) > 1  # (the hottest expert's replicas on several ranks: weights moved there)
        second = _tokens(ep)  # (routed over the replicas; the same load, measured under the new placement)
        after = ep.get_metrics()
    finally:
        ep.shutdown()
    assert first == second == want
    assert before["deepinfer:eplb_imbalance"] > 1.5
    assert after["deepinfer:eplb_imbalance"] <= 1.09
    assert after["deepinfer:eplb_rebalances"] == 1  # (no better placement for the same load)
