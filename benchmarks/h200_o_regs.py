"""H200: o_proj's registers against decode attention's. o's default tile (16 rows by 2,048, 8 warps)
takes 181 registers a thread, 46K of an SM's 64K, and attention's pass 1 (4 warps) 255, 32K: so an
o program cannot be resident beside an attention program, and o's programs on SMs where attention
still runs start (and read their weights) only after it ends. Variants: the default; 4 warps (255
registers and a 92-byte spill: 32K); 8 warps capped at 128 registers (maxnreg: 32K, spilling); 16
warps (105 registers). Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one CUDA graph
(``llama_gemv_layers.layer_chain``), median of interleaved trials. Writes $OUT/o_regs.txt.

    python3 h200_o_regs.py [--ctx 640,1024] [--trials 5]
"""
import sys

from llama_gemv_layers import Launch, chain_variants

from deepinfer_kernels.gemv import GemvConfig

# the GEMV kernel launched with maxnreg where a program has 16 rows (o's tile)
CAPPED = Launch(sys.modules["deepinfer_kernels.gemv"]._gemv_kernel, when=lambda kw: kw.get("BLOCK_N") == 16,
                maxnreg=128)
chain_variants({"o 8 warps (default)": {}, "o 4 warps": {"o_tile": GemvConfig(16, 2048, 1, 4)},
                "o 8 warps, maxnreg 128": {"gemv_kernel": CAPPED},
                "o 16 warps": {"o_tile": GemvConfig(16, 2048, 1, 16)}}, "o_regs.txt")
