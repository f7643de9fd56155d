"""The fused MoE MLP against its torch reference (an expert loop), and the reference against
independent oracles: a per-token loop in float64 and transformers' DeepSeek-V2 experts."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels import MoeConfig, fused_moe, fused_moe_ref, grouped_topk, grouped_topk_ref
from tests.kernels.paged import DTYPES

fm = importlib.import_module("deepinfer_kernels.fused_moe")  # the module (the package's name is the function)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _moe(t, d, inter, e, k, dtype, device, seed=0, experts=None):
    """x [t, d], w13 [e, 2I, d], w2 [e, d, I] scaled to outputs of about 1, float32 weights [t, k]
    and k distinct experts a token drawn from ``experts`` (default all)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g)
    w13 = torch.randn(e, 2 * inter, d, generator=g) * d ** -0.5
    w2 = torch.randn(e, d, inter, generator=g) * inter ** -0.5
    weights = torch.rand(t, k, generator=g)
    pool = torch.tensor(experts if experts is not None else range(e))
    ids = torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(t)]).to(torch.int32)
    on = {"device": device}
    return (x.to(dtype).to(**on), w13.to(dtype).to(**on), w2.to(dtype).to(**on), weights.to(**on), ids.to(**on))


def _close(got, want, dtype):
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


# --------------------------------------------------------------------- the reference and its oracles
def _per_token_loop(x, w13, w2, weights, ids):
    """out[t] = sum_k w[t, k] * W2[e] @ (silu(gate) * up), one token and one expert at a time, float64."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e].double() @ x[t].double()
            out[t] += float(weights[t, k]) * (w2[e].double() @ (F.silu(h[:inter]) * h[inter:]))
    return out


@pytest.mark.parametrize(("t", "k", "experts"), [(1, 2, None), (13, 3, None), (9, 1, None), (11, 2, [0, 3, 6])])
def test_reference_matches_a_per_token_loop(t, k, experts):
    args = _moe(t, 32, 24, 8, k, torch.float32, "cpu", experts=experts)
    torch.testing.assert_close(fused_moe_ref(*args).double(), _per_token_loop(*args), atol=1e-5, rtol=1e-5)


def test_reference_matches_transformers_deepseek_experts():
    """transformers' stacked experts (gate_up_proj [E, 2I, D], down_proj [E, D, I]) take the same
    weights as fused_moe's w13 and w2, gate rows first."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    x, w13, w2, weights, ids = _moe(10, 32, 24, 8, 3, torch.float32, "cpu", seed=4)
    cfg = DeepseekV2Config(hidden_size=32, moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=3)
    experts = DeepseekV2Experts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.copy_(w13)
        experts.down_proj.copy_(w2)
        want = experts(x, ids.long(), weights)
    torch.testing.assert_close(fused_moe_ref(x, w13, w2, weights, ids), want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the kernels (interpreter)
#: the interpreter's default tile (16 x 16 x 16), and one whose columns and K steps do not divide D and I
CONFIGS = [None, MoeConfig(16, 32, 32, group_m=1)]
CASES = {  # (T, K, experts routed to): E = 8 throughout
    "batch1": (1, 2, None),
    "ragged_T": (13, 3, None),       # 39 slots: no multiple of the 16-slot block
    "top1": (9, 1, None),
    "empty_experts": (11, 2, [1, 4, 6]),  # five experts receive nothing; each of these gets 2 blocks
    "T20_K3": (20, 3, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "16x32x32"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_moe_matches_the_reference(case, cfg, dtype, device):
    t, k, experts = CASES[case]
    d, inter = (32, 32) if cfg is None else (48, 40)
    args = _moe(t, d, inter, 8, k, dtype, device, seed=1, experts=experts)
    got = fused_moe(*args, config=cfg)
    assert got.shape == (t, d) and got.dtype == dtype
    _close(got, fused_moe_ref(*args), dtype)


class _GridRecorder:
    """Stands in for a kernel: records each launch's grid, then launches the real one."""

    def __init__(self, real):
        self.real, self.grids = real, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.real[grid]


@pytest.mark.slow
def test_batch_one_launches_programs_for_its_k_experts_only(monkeypatch, device):
    x, w13, w2, weights, ids = _moe(1, 32, 32, 8, 2, torch.float32, device, seed=2)
    rec = _GridRecorder(fm._moe_gemm_kernel)
    monkeypatch.setattr(fm, "_moe_gemm_kernel", rec)
    cfg = MoeConfig(16, 16, 16)
    _close(fused_moe(x, w13, w2, weights, ids, config=cfg), fused_moe_ref(x, w13, w2, weights, ids), torch.float32)
    # two blocks (one per chosen expert) times the column tiles: 32 / 16 of I, then of D
    assert rec.grids == [(2 * 2,), (2 * 2,)]


@pytest.mark.slow
def test_unchecked_ids_outside_the_experts_add_nothing(device):
    x, w13, w2, weights, ids = _moe(5, 32, 32, 8, 2, torch.float32, device, seed=3)
    bad = ids.clone()
    bad[1, 0], bad[3, 1] = 8, -1
    got = fused_moe(x, w13, w2, weights, bad, check_ids=False)
    dropped = weights.clone()
    dropped[1, 0] = dropped[3, 1] = 0.0
    _close(got, fused_moe_ref(x, w13, w2, dropped, ids), torch.float32)


@pytest.mark.slow
def test_int64_ids_give_the_int32_result(device):
    x, w13, w2, weights, ids = _moe(7, 32, 32, 8, 2, torch.float16, device, seed=9)
    assert torch.equal(fused_moe(x, w13, w2, weights, ids.long()), fused_moe(x, w13, w2, weights, ids))


@pytest.mark.slow
def test_routed_by_grouped_topk(device):
    """The two kernels as a model runs them: grouped_topk's weights and int32 ids straight in."""
    x, w13, w2, _, _ = _moe(6, 32, 32, 8, 2, torch.float16, device, seed=5)
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(6)).to(device)
    weights, ids = grouped_topk(logits, 2, renormalize=True)
    _close(fused_moe(x, w13, w2, weights, ids), fused_moe_ref(x, w13, w2, weights, ids), torch.float16)


def test_bad_inputs_are_refused(device):
    x, w13, w2, weights, ids = _moe(3, 32, 32, 8, 2, torch.float32, device)
    with pytest.raises(ValueError, match=r"w2 must be \[8, 32, 32\]"):
        fused_moe(x, w13, w2[:, :, :16], weights, ids)
    with pytest.raises(ValueError, match=r"fused_moe takes x \[T, D\]"):
        fused_moe(x[0], w13, w2, weights, ids)
    with pytest.raises(ValueError, match=r"must both be \[3, K\]"):
        fused_moe(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(ValueError, match="float32 topk_weights"):
        fused_moe(x, w13, w2, weights.half(), ids)
    with pytest.raises(ValueError, match="they must match"):
        fused_moe(x.half(), w13, w2, weights, ids)
    bad = ids.clone()
    bad[2, 1] = 8
    with pytest.raises(ValueError, match=r"experts .* 8; there are 8 experts, ids 0 .. 7"):
        fused_moe(x, w13, w2, weights, bad)
    bad[2, 1] = -1
    with pytest.raises(ValueError, match="there are 8 experts"):
        fused_moe(x, w13, w2, weights, bad)
    with pytest.raises(ValueError, match="contiguous along their last dimension"):
        fused_moe(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, weights, ids)
    with pytest.raises(ValueError, match="block_k >= 16"):
        fused_moe(x, w13, w2, weights, ids, config=MoeConfig(16, 16, 8))


# ---------------------------------------------------------------------------- bfloat16 on the GPU
def _v2_lite(t):
    """DeepSeek-V2-Lite's routed experts (hidden 2048, moe_intermediate 1408, 64 experts, top-6) in
    bf16, and t tokens routed by grouped_topk as the model routes them."""
    d, inter, e, k = 2048, 1408, 64, 6
    g = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    w13 = (torch.randn(e, 2 * inter, d, device="cuda", generator=g) * d ** -0.5).bfloat16()
    w2 = (torch.randn(e, d, inter, device="cuda", generator=g) * inter ** -0.5).bfloat16()
    weights, ids = grouped_topk(torch.randn(t, e, device="cuda", generator=g), k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_deepseek_v2_lite_shapes_on_the_gpu(t):
    """At the default tiles of each batch size (decode, small, large), against the expert loop."""
    x, w13, w2, weights, ids = _v2_lite(t)
    got = fused_moe(x, w13, w2, weights, ids, check_ids=False)
    want = fused_moe_ref(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    # against float32 math too, not only against the same roundings
    exact = fused_moe_ref(x.float(), w13.float(), w2.float(), weights, ids)
    assert (got.float() - exact).abs().max() < 5e-2


@pytest.mark.gpu
def test_the_same_bits_every_run_on_the_gpu():
    """No atomics: the alignment (three launches at this size) and the sum over k fix every order."""
    args = _v2_lite(4096)
    first = fused_moe(*args, check_ids=False)
    assert all(torch.equal(fused_moe(*args, check_ids=False), first) for _ in range(3))


@pytest.mark.slow
def test_fused_ops_offer_the_moe_kernels_without_the_host_check(device):
    """The CUDA devices' fused ops: grouped_topk, and fused_moe with no id check (no host sync)."""
    from deepinfer_kernels import FusedOps

    ops = FusedOps()
    assert ops.grouped_topk is grouped_topk
    x, w13, w2, weights, ids = _moe(3, 32, 32, 8, 2, torch.float32, device, seed=8)
    bad = ids.clone()
    bad[0, 1] = 99  # left out, not refused: the check that would read the ids on the host is off
    kept = weights.clone()
    kept[0, 1] = 0.0
    _close(ops.fused_moe(x, w13, w2, weights, bad), fused_moe_ref(x, w13, w2, kept, ids), torch.float32)


@pytest.mark.parametrize("version", [2, 3])
def test_references_wired_as_a_model_reproduce_transformers_moe_layer(version):
    """The wiring a model needs, checked end to end against transformers' whole MoE layer (router,
    routed experts, shared experts): float32 router logits, grouped_topk with the checkpoint's
    semantics, fused_moe over the stacked experts, plus the shared experts' MLP."""
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    common = {"hidden_size": 32, "moe_intermediate_size": 24, "n_routed_experts": 16, "num_experts_per_tok": 3,
              "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "num_attention_heads": 2,
              "num_key_value_heads": 2}
    if version == 2:  # DeepSeek-V2: softmax, group-limited, scaled and not normalised
        layer = DeepseekV2Moe(DeepseekV2Config(topk_method="group_limited_greedy", routed_scaling_factor=16.0,
                                               **common))
        routing = {"scoring": "softmax", "routed_scaling_factor": 16.0}
    else:  # DeepSeek-V3: sigmoid with the correction bias, normalised and scaled
        layer = DeepseekV3MoE(DeepseekV3Config(routed_scaling_factor=2.5, norm_topk_prob=True, **common))
        routing = {"scoring": "sigmoid", "renormalize": True, "routed_scaling_factor": 2.5,
                   "correction_bias": torch.randn(16, generator=torch.Generator().manual_seed(5)) * 0.1}
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        if version == 3:
            layer.gate.e_score_correction_bias.copy_(routing["correction_bias"])
        h = torch.randn(10, 32, generator=g)
        want = layer(h)
        logits = F.linear(h.float(), layer.gate.weight.float())
        weights, ids = grouped_topk_ref(logits, 3, n_group=4, topk_group=2, **routing)
        got = fused_moe_ref(h, layer.experts.gate_up_proj, layer.experts.down_proj, weights, ids)
        got = got + layer.shared_experts(h)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
