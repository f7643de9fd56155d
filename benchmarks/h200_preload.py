"""(Ran at f0b4711, reverted after: slower at 640 and 1,024 keys.) H200: decode attention reading
its first split's keys and values before its PDL wait (the newest key and value again after it)
against reading them all after the wait. Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one
CUDA graph (``llama_gemv_layers.layer_chain``) with the default tiles, the partials sized for 8,192
keys as a captured step's are; median of interleaved trials. Variants: keys after the wait (as
before), before it with 4 warps (the default), before it with 8 warps. Writes $OUT/preload.txt.

    python3 h200_preload.py [--ctx 640,1024,2048] [--trials 5]
"""
from llama_gemv_layers import attention_pass, chain_variants

chain_variants({"after the wait": {"pass_one": attention_pass(PRELOAD=False)}, "before, 4 warps": {},
                "before, 8 warps": {"pass_one": attention_pass(num_warps=8)}}, "preload.txt", "640,1024,2048")
