"""DeepSeek's routing (``route``) and the torch reference of the routed experts (``moe_experts``)
against transformers' DeepseekV2/V3 router and experts modules (the oracle)."""
from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

from deepinfer.models.moe import Routing, moe_experts, route

HIDDEN, EXPERTS, TOKENS = 64, 8, 37
ROUTERS = {
    "v2-greedy": (v2.DeepseekV2Config, v2.DeepseekV2TopkRouter,
                  {"topk_method": "greedy", "routed_scaling_factor": 1.5},
                  Routing(3, "softmax", routed_scaling_factor=1.5)),
    "v2-group-limited": (v2.DeepseekV2Config, v2.DeepseekV2TopkRouter,
                         {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
                         Routing(3, "softmax", 4, 2, group_limited=True)),
    "v3-sigmoid-groups": (v3.DeepseekV3Config, v3.DeepseekV3TopkRouter,
                          {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5},
                          Routing(3, "sigmoid", 4, 2, group_limited=True, norm_topk_prob=True,
                                  routed_scaling_factor=2.5)),
    "v3-unnormalised": (v3.DeepseekV3Config, v3.DeepseekV3TopkRouter,
                        {"n_group": 2, "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0},
                        Routing(3, "sigmoid", 2, 1, group_limited=True)),
}


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids, order = ids.long().sort(dim=-1)
    return weights.gather(1, order), ids


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_route_picks_transformers_experts_and_weights(name):
    cfg_cls, router_cls, fields, routing = ROUTERS[name]
    cfg = cfg_cls(hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=EXPERTS, num_experts_per_tok=3,
                  **fields)
    g = torch.Generator().manual_seed(0)
    router = router_cls(cfg)
    bias = None
    with torch.no_grad():
        router.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=g))
        if hasattr(router, "e_score_correction_bias"):  # (zeros in transformers' init: make it choose)
            bias = torch.randn(EXPERTS, generator=g) * 0.1
            router.e_score_correction_bias.copy_(bias)
        x = torch.randn(TOKENS, HIDDEN, generator=g)
        logits, want_w, want_ids = router(x)
    weights, ids = route(logits, routing, bias)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (TOKENS, 3)
    got_w, got_ids = _sorted(weights, ids)
    want_w, want_ids = _sorted(want_w, want_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_group_limits_change_the_choice():
    """Guards the group cases above: limiting to the best groups picks other experts here."""
    logits = torch.randn(TOKENS, EXPERTS, generator=torch.Generator().manual_seed(1))
    free = route(logits, Routing(3, "softmax"))[1].sort(-1).values
    grouped = route(logits, Routing(3, "softmax", 4, 2, group_limited=True))[1].sort(-1).values
    assert not torch.equal(free, grouped)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_moe_experts_equal_transformers_experts(dtype, tol):
    inter, top_k = 32, 2
    cfg = tf.DeepseekV2Config(hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=EXPERTS,
                              moe_intermediate_size=inter, num_experts_per_tok=top_k)
    experts = v2.DeepseekV2Experts(cfg)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # transformers' stacks have our layout: [E, 2I, D] gate rows then up rows; [E, D, I]
        experts.gate_up_proj.copy_(torch.randn(EXPERTS, 2 * inter, HIDDEN, generator=g) * 0.2)
        experts.down_proj.copy_(torch.randn(EXPERTS, HIDDEN, inter, generator=g) * 0.2)
        experts.to(dtype)
        x = torch.randn(TOKENS, HIDDEN, generator=g).to(dtype)
        # (the last expert gets no token: an empty slice)
        ids = torch.stack([torch.randperm(EXPERTS - 1, generator=g)[:top_k] for _ in range(TOKENS)])
        weights = torch.rand(TOKENS, top_k, generator=g)
        want = experts(x, ids, weights)
    got = moe_experts(x, experts.gate_up_proj.data, experts.down_proj.data, weights, ids.to(torch.int32))
    assert got.dtype == dtype and got.shape == x.shape
    assert (got.float() - want.float()).abs().max().item() < tol * want.float().abs().max().item()


class _KernelRefs:
    """Fused ops with the kernels' torch references in place of the kernels: what a MoE layer hands
    them and how it reads their answers (the kernels are tested against the same references)."""

    def __init__(self):
        from deepinfer_kernels.fused_moe import fused_moe_ref
        from deepinfer_kernels.moe_routing import grouped_topk_ref

        self.calls = []
        self._topk, self._moe = grouped_topk_ref, fused_moe_ref

    def grouped_topk(self, *args, **kwargs):
        self.calls.append("grouped_topk")
        return self._topk(*args, **kwargs)

    def fused_moe(self, *args):
        self.calls.append("fused_moe")
        return self._moe(*args)


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_a_moe_layer_with_the_devices_kernels_gives_its_torch_output(name):
    from deepinfer.models.moe import MoE

    routing = ROUTERS[name][3]
    g = torch.Generator().manual_seed(1)
    layer = MoE(HIDDEN, EXPERTS, 32, 1, routing)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    want = layer(x)
    layer.fused_ops = ops = _KernelRefs()
    got = layer(x)
    assert ops.calls == ["grouped_topk", "fused_moe"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert layer.expert_load.sum() == 2 * TOKENS * routing.top_k  # (counted in both calls)
