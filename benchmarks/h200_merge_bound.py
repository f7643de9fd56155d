"""H200: an upper bound for moving decode attention's merge out of its kernel. Batch 1, Llama-3.2-1B
shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache, attention, o, gate/up,
down), median of interleaved trials: attention as now (pass 1 merges its splits: a counter, then
the partials' reads) against pass 1 writing its partials only (no counter, no merge; o then reads
a stale output, so only the times mean anything), each with the o GEMV's tile of 4 rows a program
(the default when this ran) and with 16 rows (the default since). Writes $OUT/merge_bound.txt.

    python3 h200_merge_bound.py [--ctx 640,1024] [--trials 5]
"""
from llama_gemv_layers import attention_pass, chain_variants

from deepinfer_kernels.gemv import GemvConfig

O4, O16 = GemvConfig(4, 2048, 1, 8), GemvConfig(16, 2048, 1, 8)  # o: the default before session 16, after
NO_MERGE = attention_pass(MERGE=False)
# (partials sized for each length and no L2 hints, as when this ran; "no merge" leaves o reading a
# stale output: no residual check)
chain_variants({"merge in pass 1, o 4 rows": {"o_tile": O4}, "no merge, o 4 rows": {"pass_one": NO_MERGE, "o_tile": O4},
                "merge in pass 1, o 16 rows": {"o_tile": O16},
                "no merge, o 16 rows": {"pass_one": NO_MERGE, "o_tile": O16}},
               "merge_bound.txt", check=False, max_seq_len=None, evict="")
