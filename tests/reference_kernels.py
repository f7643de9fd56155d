"""The triton attention backend's kernels swapped for their torch references, in a child process
whose subject is the engine around the kernels (device graphs, drafting loops), not the kernels.

The kernels themselves are checked against these references in tests/kernels, and whole engines
with the real kernels in the interpreter in tests/plugins/test_triton_attn.py and
test_graphs.py; the GPU tests replay the real kernels in CUDA graphs. What the graph tests check
(the same tokens from padded, static-buffer steps as from eager ones) holds or fails alike with
either arithmetic, and the references run in a few milliseconds a step where the interpreter takes
seconds. The stand-ins keep the kernels' contract where a graph can break it: the shapes are
checked as the kernels check them, and a sequence longer than the ``max_seq_len`` the launch was
given, or a query longer than ``max_query_len`` (each sizes the real kernel's grid, so a stale one
drops keys or queries), is an error.
"""
from __future__ import annotations

import torch


def use_reference_attention() -> None:
    """Replace deepinfer_kernels' attention and cache-write kernels with their references."""
    import deepinfer_kernels as kernels
    from deepinfer_kernels import paged_attention

    def covered(seq_lens: torch.Tensor, max_seq_len: int | None) -> None:
        if max_seq_len is not None and seq_lens.numel() and int(seq_lens.max()) > max_seq_len:
            raise AssertionError(f"{int(seq_lens.max())} tokens in a launch sized for at most {max_seq_len}: "
                                 "the kernel would read only part of them")

    def decode(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, sliding_window=None,
               max_seq_len=None, split_size=kernels.DEFAULT_SPLIT, **_tuning):
        paged_attention._check_shapes(q, k_cache, v_cache, block_tables, seq_lens, split_size)
        covered(seq_lens, max_seq_len)
        return kernels.paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale,
                                                  sliding_window, max_seq_len, split_size)

    def mla_decode(q, kv_cache, block_tables, seq_lens, block_size, value_dim, scale, max_seq_len=None,
                   split_size=kernels.DEFAULT_SPLIT, **_tuning):
        covered(seq_lens, max_seq_len)
        return kernels.mla_decode_attention_ref(q, kv_cache, block_tables, seq_lens, block_size, value_dim, scale,
                                                max_seq_len, split_size)

    def prefill(q, k_cache, v_cache, query_start_loc, seq_lens, context_lens, block_tables, block_size, scale,
                sliding_window=None, max_query_len=None, **_tiles):
        covered(query_start_loc.diff(), max_query_len)
        return kernels.paged_prefill_attention_ref(q, k_cache, v_cache, query_start_loc, seq_lens, context_lens,
                                                   block_tables, block_size, scale, sliding_window, max_query_len)

    def write_kv(k, v, k_cache, v_cache, slot_mapping, pdl=False):
        kernels.write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping)

    kernels.paged_decode_attention = decode
    kernels.mla_decode_attention = mla_decode
    kernels.paged_prefill_attention = prefill
    kernels.write_kv_cache = write_kv
    kernels.write_mla_cache = kernels.write_mla_cache_ref
