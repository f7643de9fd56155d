"""DeepSeek's grouped top-k routing: the kernel against its torch reference, and the reference against
transformers' DeepSeek-V2 and V3 routers built from tiny configs."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import grouped_topk, grouped_topk_ref

V2_GREEDY = {"scoring": "softmax"}                                         # DeepSeek-V2-Lite
V2_GROUPED = {"scoring": "softmax", "n_group": 4, "topk_group": 2, "routed_scaling_factor": 16.0}  # V2
V3 = {"scoring": "sigmoid", "n_group": 4, "topk_group": 2, "renormalize": True, "routed_scaling_factor": 2.5}


def _logits(t, e, seed=0, device="cpu"):
    return torch.randn(t, e, generator=torch.Generator().manual_seed(seed)).to(device)


def _bias(e, seed=1, device="cpu"):
    return (torch.randn(e, generator=torch.Generator().manual_seed(seed)) * 0.2).to(device)


def _by_expert(weights, ids):
    """Each row's (id, weight) pairs sorted by id: transformers' topk(sorted=False) fixes no order."""
    order = ids.long().sort(-1).indices
    return ids.long().gather(1, order), weights.gather(1, order)


# ----------------------------------------------------------------- the reference against transformers
def _hf_route(version, e, k, hidden, **cfg):
    """transformers' router of a tiny config with random weights: (logits, weights, ids) of ``hidden``."""
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config_cls, router_cls = (DeepseekV2Config, DeepseekV2TopkRouter) if version == 2 else \
        (DeepseekV3Config, DeepseekV3TopkRouter)
    router = router_cls(config_cls(hidden_size=hidden.shape[1], num_attention_heads=2, num_key_value_heads=2,
                                   n_routed_experts=e, num_experts_per_tok=k, **cfg))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=g))
        if version == 3:
            router.e_score_correction_bias.copy_(_bias(e))
        return router(hidden)


@pytest.mark.parametrize(("name", "version", "hf_cfg", "ours"), [
    ("v2_lite_greedy", 2, {"topk_method": "greedy", "routed_scaling_factor": 1.0}, V2_GREEDY),
    ("v2_group_limited", 2, {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                             "routed_scaling_factor": 16.0}, V2_GROUPED),
    ("v3", 3, {"n_group": 4, "topk_group": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5}, V3),
    ("v3_unnormalised", 3, {"n_group": 4, "topk_group": 2, "norm_topk_prob": False, "routed_scaling_factor": 1.0},
     {**V3, "renormalize": False, "routed_scaling_factor": 1.0}),
])
def test_reference_matches_transformers_router(name, version, hf_cfg, ours):
    hidden = torch.randn(24, 16, generator=torch.Generator().manual_seed(3))
    logits, hf_weights, hf_ids = _hf_route(version, 16, 3, hidden, **hf_cfg)
    bias = _bias(16) if version == 3 else None
    weights, ids = grouped_topk_ref(logits, 3, correction_bias=bias, **ours)
    got_ids, got_w = _by_expert(weights, ids)
    want_ids, want_w = _by_expert(hf_weights, hf_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-6)


def test_reference_group_limit_changes_the_choice():
    """The oracle test above is only as strong as its cases: on these logits the group limit (and the
    V3 group rule) does choose other experts than a plain top-k would."""
    logits = torch.randn(24, 16, generator=torch.Generator().manual_seed(3)) @ \
        torch.randn(16, 16, generator=torch.Generator().manual_seed(7)).T
    plain = grouped_topk_ref(logits, 3)[1]
    assert not torch.equal(grouped_topk_ref(logits, 3, **V2_GROUPED)[1], plain)
    assert not torch.equal(grouped_topk_ref(logits, 3, correction_bias=_bias(16), **V3)[1],
                           grouped_topk_ref(logits, 3, correction_bias=_bias(16), scoring="sigmoid")[1])


def test_reference_breaks_ties_toward_the_lower_index():
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0]])
    assert grouped_topk_ref(logits, 2)[1].tolist() == [[1, 2]]
    # groups of 2: group 0 {0, 1} and group 1 {2, 3} tie at 1.0; the lower one is kept
    assert grouped_topk_ref(logits, 2, n_group=4, topk_group=1)[1].tolist() == [[1, 0]]


# ----------------------------------------------------------------------------- the kernel (interpreter)
CASES = {  # name: (T, E, top_k, semantics)
    "v2_lite_greedy": (20, 64, 6, V2_GREEDY),
    "v2_group_limited": (7, 16, 3, V2_GROUPED),
    "v3": (9, 32, 4, V3),
    "v3_ragged_groups": (5, 20, 3, V3),  # groups of 5 experts; E no power of two
    "top1_renormalised": (6, 8, 1, {"renormalize": True}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_topk_matches_the_reference(case, device):
    t, e, k, sem = CASES[case]
    logits = _logits(t, e, device=device)
    bias = _bias(e, device=device) if sem.get("scoring") == "sigmoid" else None
    weights, ids = grouped_topk(logits, k, correction_bias=bias, **sem)
    want_w, want_ids = grouped_topk_ref(logits, k, correction_bias=bias, **sem)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (t, k)
    assert torch.equal(ids, want_ids)  # same order too: best first
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_grouped_topk_breaks_ties_as_the_reference(device):
    """Exact ties, among experts and among groups: the lower index first, in both."""
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0],
                           [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    for sem in ({}, {"n_group": 4, "topk_group": 1}, {"n_group": 4, "topk_group": 2, "scoring": "sigmoid",
                                                      "correction_bias": torch.zeros(8, device=device)}):
        ids = grouped_topk(logits, 2, **sem)[1]
        assert torch.equal(ids, grouped_topk_ref(logits, 2, **sem)[1]), sem


@pytest.mark.slow
def test_half_precision_logits_are_routed_in_float32(device):
    logits = _logits(4, 16, seed=2, device=device).half()
    weights, ids = grouped_topk(logits, 2, **V2_GROUPED)
    want_w, want_ids = grouped_topk_ref(logits, 2, **V2_GROUPED)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_refused(device):
    logits = _logits(2, 16, device=device)
    with pytest.raises(ValueError, match="router_logits"):
        grouped_topk(logits[0], 2)
    with pytest.raises(ValueError, match="scoring must be"):
        grouped_topk(logits, 2, scoring="relu")
    with pytest.raises(ValueError, match="equal groups"):
        grouped_topk(logits, 2, n_group=3)
    with pytest.raises(ValueError, match="equal groups"):
        grouped_topk(logits, 2, n_group=4, topk_group=5)
    with pytest.raises(ValueError, match="top_k = 9 must be between 1 and the experts of the kept groups"):
        grouped_topk(logits, 9, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match=r"correction_bias must be \[16\]"):
        grouped_topk(logits, 2, correction_bias=torch.zeros(8, device=device))
    with pytest.raises(ValueError, match="two best"):
        grouped_topk(logits, 2, n_group=16, topk_group=4, correction_bias=torch.zeros(16, device=device))


# ---------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize(("e", "k", "sem"), [(64, 6, V2_GREEDY), (160, 6, {**V2_GROUPED, "n_group": 8, "topk_group": 3}),
                                             (256, 8, {**V3, "n_group": 8, "topk_group": 4})],
                         ids=["v2_lite", "v2", "v3"])
def test_deepseek_shapes_on_the_gpu(e, k, sem):
    """The real models' routing at 4,096 tokens. The kernel's exp and the reference's may differ in the
    last bit, which can swap two experts whose scores are that close: at most 0.1% of the rows may
    differ, and the rows that agree must have the reference's weights."""
    logits = torch.randn(4096, e, device="cuda", generator=torch.Generator(device="cuda").manual_seed(e))
    bias = _bias(e, device="cuda") if sem.get("scoring") == "sigmoid" else None
    weights, ids = grouped_topk(logits.bfloat16(), k, correction_bias=bias, **sem)
    want_w, want_ids = grouped_topk_ref(logits.bfloat16(), k, correction_bias=bias, **sem)
    same = (ids == want_ids).all(-1)
    assert int((~same).sum()) <= 4
    torch.testing.assert_close(weights[same], want_w[same], atol=1e-5, rtol=1e-5)
