"""DeepSeek-V2/V3 through the engine against transformers (the oracle): greedy tokens in mixed
batches, under chunked prefill and preemption, with prefix-cache hits; bfloat16 prompt logprobs;
the expert load counters against transformers' own routing; every KV block free afterwards."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.builder import check_latent_support, latent_attention_plugins
from deepinfer.core.model_config import ModelConfigError
from deepinfer.plugins import AttentionLayerSpec, PluginError
from tests.tiny_models import hf_greedy, make_model

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
        "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
# together: both routings, group limits, shared experts, a dense first layer (tiny_models' default) or
# none, yarn (its cos/sin factor and softmax mscale both != 1 here), q_lora_rank set and unset, rope
# over interleaved pairs and over halves
CASES = {
    "v2-group-limited-yarn": ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                                              "rope_parameters": YARN}),
    "v3-no-q-lora": ("deepseek_v3", {"q_lora_rank": None, "n_group": 4, "topk_group": 2, "n_shared_experts": 2,
                                     "num_hidden_layers": 3}),
    "v3-yarn-halves-all-moe": ("deepseek_v3", {"n_group": 2, "topk_group": 1, "rope_parameters": YARN,
                                               "rope_interleave": False, "first_k_dense_replace": 0}),
}
PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170))]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    model = make_model(path, arch, with_tokenizer=False, **overrides)
    expected = [hf_greedy(model, p, GREEDY.max_tokens) for p in PROMPTS]
    return model, str(path), expected, LLM(str(path), device="cpu", dtype="float32", block_size=8, progress=False)


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _all_free(llm: LLM) -> None:
    pool = llm.engine.kv.pool
    pool.check_all_free()
    assert pool.num_free_blocks == pool.num_blocks


def test_greedy_tokens_equal_transformers_in_a_mixed_batch(case):
    _, _, expected, llm = case
    assert _tokens(llm) == expected
    _all_free(llm)


def test_chunked_prefill_and_preemption_keep_transformers_tokens(case):
    _, path, expected, _ = case
    # 16 blocks of 8 tokens: one request fits (max_model_len 128), all three do not -> preemption;
    # a budget of 16 tokens a step splits the longer prompts into chunks
    llm = LLM(path, dtype="float32", block_size=8, num_kv_blocks=16, max_model_len=128, max_num_batched_tokens=16,
              progress=False)
    assert _tokens(llm) == expected
    assert llm.get_metrics()["deepinfer:num_preemptions"] > 0
    _all_free(llm)


def test_overlapped_steps_keep_transformers_tokens(case):
    """The overlapped loop (off on the CPU by default, switched on here) with the latent cache."""
    _, path, expected, _ = case
    llm = LLM(path, dtype="float32", block_size=8, max_num_batched_tokens=32, progress=False)
    llm.engine.overlap = True
    assert _tokens(llm) == expected
    _all_free(llm)


def test_prefix_cache_hits_keep_transformers_tokens(case):
    _, path, expected, _ = case
    llm = LLM(path, dtype="float32", block_size=8, plugins=["prefix-cache"], progress=False)
    assert _tokens(llm, PROMPTS[1:]) == expected[1:]
    assert _tokens(llm, PROMPTS[1:]) == expected[1:]  # the prompts again: from cached blocks
    assert llm.get_metrics()["deepinfer:prefix_cache_hits"] > 0
    _all_free(llm)


def test_expert_load_counts_transformers_routing(case):
    """Each MoE layer's counts are those of transformers' routers over the same tokens (every token
    the engine computed: the prompt and each output but the last), so they sum to tokens * top_k."""
    model, _, expected, llm = case
    llm.reset_expert_load()
    _tokens(llm)
    got = llm.expert_load()
    routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    want = torch.zeros(len(routers), model.config.n_routed_experts, dtype=torch.int64)

    def count(i: int):
        def hook(module, args, out) -> None:  # out: (router logits, top-k weights, top-k ids)
            want[i] += torch.bincount(out[2].flatten(), minlength=want.shape[1])
        return hook

    hooks = [r.register_forward_hook(count(i)) for i, r in enumerate(routers)]
    with torch.no_grad():
        for prompt, out in zip(PROMPTS, expected, strict=True):
            model(torch.tensor([prompt + out[:-1]]))
    for h in hooks:
        h.remove()
    tokens = sum(len(p) + len(o) - 1 for p, o in zip(PROMPTS, expected, strict=True))
    assert got.shape == want.shape and got.dtype == torch.int64
    assert got.sum(dim=1).tolist() == [tokens * model.config.num_experts_per_tok] * len(routers)
    assert torch.equal(got, want)
    metrics = llm.get_metrics()
    assert metrics["deepinfer:moe_routed_tokens"] == got.sum().item()
    assert metrics["deepinfer:moe_expert_load_imbalance"] >= 1
    llm.reset_expert_load()
    assert llm.expert_load().sum().item() == 0


def test_bfloat16_prompt_logprobs_within_1e_2_of_transformers(tmp_path):
    """bfloat16 on both sides (transformers rotates and attends in other orders and precisions):
    the prompt tokens' logprobs differ by less than 1e-2 (1.9e-3 at most when written)."""
    model = make_model(tmp_path, "deepseek_v3", dtype=torch.bfloat16, with_tokenizer=False, n_group=4,
                       topk_group=2, rope_parameters=YARN)
    llm = LLM(str(tmp_path), progress=False)  # dtype auto: bfloat16 from config.json
    assert llm.engine.runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    prompt = PROMPTS[2]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    errs = [abs(out.prompt_logprobs[i][prompt[i]] - ref[i - 1, prompt[i]].item()) for i in range(1, len(prompt))]
    assert max(errs) < 1e-2


def test_yarn_and_correction_bias_change_the_oracle(tmp_path):
    """Guards the cases above: yarn scaling and V3's score correction bias change the logits."""
    ids = torch.tensor([PROMPTS[2]])
    plain = make_model(tmp_path / "plain", "deepseek_v3", with_tokenizer=False, n_group=4, topk_group=2)
    yarn = make_model(tmp_path / "yarn", "deepseek_v3", with_tokenizer=False, n_group=4, topk_group=2,
                      rope_parameters=YARN)
    with torch.no_grad():
        logits = plain(ids).logits
        assert not torch.allclose(logits, yarn(ids).logits, atol=1e-4)
        for layer in plain.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.zero_()
        assert not torch.allclose(logits, plain(ids).logits, atol=1e-4)


@pytest.mark.parametrize("arch, field, value, says", [
    ("deepseek_v2", "topk_method", "noaux_tc", "greedy, group_limited_greedy"),
    ("deepseek_v2", "norm_topk_prob", True, "set it to false"),
    ("deepseek_v3", "scoring_func", "softmax", "sigmoid"),
    ("deepseek_v3", "n_group", 3, "must divide n_routed_experts"),
    ("deepseek_v3", "moe_layer_freq", 2, "supported: 1"),
    ("deepseek_v2", "hidden_act", "gelu", "supported: silu"),
])
def test_unsupported_config_values_are_refused_with_what_is_valid(tmp_path, arch, field, value, says):
    make_model(tmp_path, arch, with_tokenizer=False, n_group=4, topk_group=2)
    import json
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=field) as err:
        LLM(str(tmp_path), dtype="float32", progress=False)
    assert says in str(err.value)


def test_an_attention_plugin_without_latent_kv_is_refused_by_name():
    from deepinfer_builtin.attention.torch_attn import TorchAttention

    class Keyed(TorchAttention):
        name = "keyed"
        supports_latent_kv = False

    assert "torch" in latent_attention_plugins()
    layers = [AttentionLayerSpec(0, 4, 1, 40, scale=0.1), AttentionLayerSpec(1, 4, 1, 40, scale=0.1, value_dim=32)]
    with pytest.raises(PluginError, match=r"'keyed' cannot serve the latent KV cache .* choose one that does: .*torch"):
        check_latent_support(Keyed, layers, "DeepseekV3ForCausalLM")
    check_latent_support(Keyed, layers[:1], "LlamaForCausalLM")  # no latent layer: nothing to refuse


def test_expert_load_of_a_model_without_experts_is_refused(tmp_path):
    make_model(tmp_path, "llama", with_tokenizer=False)
    llm = LLM(str(tmp_path), dtype="float32", progress=False)
    with pytest.raises(TypeError, match="LlamaForCausalLM.*no routed experts"):
        llm.expert_load()
    assert "deepinfer:moe_routed_tokens" not in llm.get_metrics()


@pytest.mark.gpu
def test_cuda_engine_with_the_fused_moe_kernels_keeps_transformers_tokens(case, monkeypatch):
    """On an NVIDIA GPU (float32, torch attention): the device's fused ops run the routed experts
    (fused_moe) and route them (grouped_topk), and the tokens stay transformers'."""
    from deepinfer_kernels.fused_ops import FusedOps

    _, path, expected, _ = case
    calls = []
    fused_moe = FusedOps.fused_moe

    def counted(self, *args):
        calls.append(len(args[0]))
        return fused_moe(self, *args)

    monkeypatch.setattr(FusedOps, "fused_moe", counted)
    llm = LLM(path, device="sm90", plugins=["torch"], dtype="float32", block_size=8, num_kv_blocks=64,
              max_model_len=128, progress=False)
    assert _tokens(llm) == expected
    assert calls  # (the routed experts of every MoE layer, every step)
    _all_free(llm)
