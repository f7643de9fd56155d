"""(Ran at 4f7db5d, reverted after: slower.) H200: the single-token qkv GEMV's programs, once
done, ask the L2 for gate/up's first rows (both halves), which arrive while attention runs; gate/up
then reads them from the L2. Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one CUDA graph
(``llama_gemv_layers.layer_chain``, every weight load evict_first), median of interleaved trials,
by MB prefetched a layer. Writes $OUT/l2_prefetch.txt.

    python3 h200_l2_prefetch.py [--ctx 640,1024] [--mb 0,8,12,16,24] [--trials 5]
"""
import argparse

from llama_gemv_layers import chain_variants

ap = argparse.ArgumentParser()
ap.add_argument("--mb", default="0,8,12,16,24")
mb = ap.parse_known_args()[0].mb
chain_variants({f"prefetch {m} MB": {"prefetch_mb": float(m)} for m in mb.split(",")}, "l2_prefetch.txt")
