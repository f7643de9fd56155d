"""The roofline counts against hand-computed cases: the work a step needs, not the parameter count."""
from __future__ import annotations

import pytest

from deepinfer.bench.roofline import (
    LayerWork,
    ModelWork,
    RoutedExperts,
    causal_pairs,
    decode_bytes,
    prefill_flops,
    step_bytes,
)
from deepinfer.bench.workloads import Workload, fixed


def small(tied: bool = True, layers: tuple[LayerWork, ...] | None = None) -> ModelWork:
    """hidden 4, vocab 10 (a 40-parameter head), 100 dense parameters, 2 bytes each; one full layer
    of 2 heads of 3 (2 x 2 x (3 + 3) = 24 FLOPs a (query, key) pair) caching 8 bytes a token."""
    return ModelWork(dense_params=100, hidden_size=4, vocab_size=10, tied_embeddings=tied, bytes_per_param=2,
                     layers=layers or (LayerWork(num_heads=2, head_dim=3, kv_bytes_per_token=8),))


def test_prefill_of_several_prompts_counts_the_head_for_each_prompts_last_row_only():
    # prompts of 3 and 2 tokens: dense 2 x 100 x 5 = 1000; head 2 x 40 x 2 rows = 160;
    # causal pairs 6 + 3 = 9, x 24 = 216
    assert prefill_flops(small(), [3, 2]) == 1376
    # logits for all 5 rows: head 2 x 40 x 5 = 400
    assert prefill_flops(small(), [3, 2], logit_rows=5) == 1616


def test_prefill_of_the_llama_1b_shape_leaves_out_the_embedding_table():
    # issue 75: 4 x 4096 tokens of the Llama-3.2-1B shape do about 36.3 TFLOP (the old count,
    # 2 x all 1.236e9 parameters x tokens, gave 44.9)
    vocab, hidden = 128256, 2048
    layer = LayerWork(num_heads=32, head_dim=64, kv_bytes_per_token=2 * 8 * 64 * 2)
    work = ModelWork(1_235_814_400 - vocab * hidden, hidden, vocab, True, 2, (layer,) * 16)
    assert prefill_flops(work, [4096] * 4) / 1e12 == pytest.approx(36.29, abs=0.01)


def test_sliding_window_caps_the_pairs_of_a_prefill():
    # 5 tokens, window 2: 1 + 2 + 2 + 2 + 2
    assert causal_pairs(5, 2) == 9
    assert causal_pairs(5, None) == causal_pairs(5, 5) == 15
    hybrid = small(layers=(LayerWork(2, 3, 8), LayerWork(2, 3, 4, sliding_window=2)))
    # dense 2 x 100 x 5 = 1000, head 80, attention 24 x (15 + 9) = 576
    assert prefill_flops(hybrid, [5]) == 1656


def test_sliding_layers_read_only_their_windows_kv_in_decode():
    hybrid = small(layers=(LayerWork(2, 3, 8), LayerWork(2, 3, 4, sliding_window=2)))
    # contexts 5 and 1: full layer 8 x (5 + 1) = 48 bytes, sliding 4 x (2 + 1) = 12;
    # weights (100 + 40) x 2 bytes = 280
    assert step_bytes(hybrid, [5, 1]) == 340


def test_a_tied_embedding_is_read_once_as_the_head_and_an_untied_table_only_for_the_rows_looked_up():
    # three sequences of contexts 2, 3, 4: KV 8 x 9 = 72 bytes
    # tied: (100 + 40) x 2 = 280; untied: head 40 and three rows of 4 -> (100 + 40 + 12) x 2 = 304
    assert step_bytes(small(tied=True), [2, 3, 4]) == 352
    assert step_bytes(small(tied=False), [2, 3, 4]) == 376


def test_decode_bytes_sum_the_steps_as_sequences_finish():
    wl = Workload(prompts=[[1, 1], [1, 1, 1]], output_lens=[2, 1])
    # step 0: contexts 2 and 3 (280 + 8 x 5); step 1: the first sequence alone at 3 (280 + 24)
    assert decode_bytes(small(), wl) == 320 + 304


def test_moe_step_reads_the_union_of_the_experts_its_tokens_chose():
    moe = RoutedExperts(num_experts=4, top_k=2, params_per_expert=10)
    work = small(layers=(LayerWork(2, 3, 8, experts=moe),))
    # two tokens chose {0, 1} and {1, 2}: three experts read, 30 parameters -> (140 + 30) x 2 = 340;
    # KV 8 x (1 + 2) = 24
    assert step_bytes(work, [1, 2], routed=[[[0, 1], [1, 2]]]) == 364
    # each token multiplies by its top-2 experts in a prefill: dense 2 x (100 + 20) x 3 = 720,
    # head 80, attention 24 x 6 = 144
    assert prefill_flops(work, [3]) == 944
    with pytest.raises(ValueError, match="for 2 MoE layers; the model has 1"):
        step_bytes(work, [1], routed=[[[0, 1]], [[2, 3]]])


def test_moe_step_without_routing_expects_the_uniform_union():
    moe = RoutedExperts(num_experts=4, top_k=2, params_per_expert=10)
    work = small(layers=(LayerWork(2, 3, 8, experts=moe),))
    # one token: exactly its 2 experts; two uniform tokens: 4 x (1 - (1/2)^2) = 3 expected
    assert step_bytes(work, [1]) == (140 + 20) * 2 + 8
    assert step_bytes(work, [1, 1]) == (140 + 30) * 2 + 16


def test_batch1_decode_of_the_llama_1b_shape_matches_the_weights_bound():
    # BENCHMARKS.md: 2.47 GB of weights a step at 4.23 TB/s -> 1,712 tok/s; the KV read adds under 1%
    vocab, hidden = 128256, 2048
    layer = LayerWork(num_heads=32, head_dim=64, kv_bytes_per_token=2 * 8 * 64 * 2)
    work = ModelWork(1_235_814_400 - vocab * hidden, hidden, vocab, True, 2, (layer,) * 16)
    seconds = decode_bytes(work, fixed(1, 512, 256, 1000)) / 4.23e12
    assert 256 / seconds == pytest.approx(1697, abs=5)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_model_work_of_an_engine_leaves_out_the_table_and_the_head(tmp_path, tied):
    from deepinfer.llm import LLM
    from tests.tiny_models import hybrid, make_model

    hf = make_model(tmp_path, "qwen3", tie_word_embeddings=tied, **hybrid(8))
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", progress=False)
    work = ModelWork.of(llm.engine)
    cfg = hf.config
    head = cfg.vocab_size * cfg.hidden_size
    # transformers counts a tied table once
    assert work.dense_params == hf.num_parameters() - head - (0 if tied else head)
    assert work.tied_embeddings is tied and work.bytes_per_param == 4
    assert [x.sliding_window for x in work.layers] == [8, None]
    assert [x.kv_bytes_per_token for x in work.layers] == [2 * cfg.num_key_value_heads * 16 * 4] * 2


@pytest.mark.slow
def test_model_work_of_a_deepseek_engine_sets_its_routed_experts_and_latent_rows_apart(tmp_path):
    from deepinfer.llm import LLM
    from tests.tiny_models import make_model

    hf = make_model(tmp_path, "deepseek_v3", with_tokenizer=False, num_hidden_layers=3, n_group=2, topk_group=1)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", progress=False)
    work = ModelWork.of(llm.engine)
    cfg = hf.config
    head = cfg.vocab_size * cfg.hidden_size
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size
    moe = [x.experts for x in work.layers]
    assert moe[0] is None and all(x == RoutedExperts(cfg.n_routed_experts, cfg.num_experts_per_tok, per_expert)
                                  for x in moe[cfg.first_k_dense_replace:])
    routed = (cfg.num_hidden_layers - cfg.first_k_dense_replace) * cfg.n_routed_experts * per_expert
    bias = (cfg.num_hidden_layers - cfg.first_k_dense_replace) * cfg.n_routed_experts  # a buffer in transformers
    assert work.dense_params == hf.num_parameters() + bias - 2 * head - routed
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim  # one latent row a token, read as key and value
    assert {(x.head_dim, x.v_head_dim, x.kv_bytes_per_token) for x in work.layers} == {(row, cfg.kv_lora_rank, row * 4)}
