"""H200: decode attention's pipeline stages in steps of one token (one tile a split: the loop runs
once, so stages buy no overlap and cost shared memory), and the keys read before the PDL wait
(f0b4711's kernel file, which the call carried as benchmarks/paged_attention_preload_f0b4711.py:
`git show f0b4711:kernels/paged_attention.py`) with fewer stages. Batch 1, Llama-3.2-1B shape,
bf16, 16 whole layers in one CUDA graph (``llama_gemv_layers.layer_chain``), median of interleaved
trials. Writes $OUT/attn_stages.txt.

    python3 h200_attn_stages.py [--ctx 640,1024] [--trials 5]
"""
import importlib.util

from llama_gemv_layers import attention_pass, chain_variants

spec = importlib.util.spec_from_file_location("preload", "paged_attention_preload_f0b4711.py")
pre = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pre)
PRE = pre._decode_split_kernel
chain_variants({"2 stages (default)": {}, "1 stage": {"pass_one": attention_pass(num_stages=1)},
                "3 stages": {"pass_one": attention_pass(num_stages=3)},
                "keys early, 2 stages": {"pass_one": attention_pass(PRE, PRELOAD=True)},
                "keys early, 1 stage": {"pass_one": attention_pass(PRE, PRELOAD=True, num_stages=1)}},
               "attn_stages.txt")
