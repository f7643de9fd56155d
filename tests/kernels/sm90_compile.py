"""Compile every kernel for Hopper (sm_90) with Triton's bundled ptxas: no GPU needed.

Run as ``python -m tests.kernels.sm90_compile`` with TRITON_INTERPRET unset (triton must be in
compiled mode). The public wrappers are called on tiny CPU tensors while ``Kernel._pick`` is
replaced by a recorder; each recorded launch is then lowered by Triton's NVIDIA backend down to a
cubin. This catches what the interpreter lets through and the compiler rejects (loop-carried
types, dot shapes, constexpr misuse).
"""
from __future__ import annotations

import sys
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import deepinfer_kernels as K
from deepinfer_kernels._launch import Kernel

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int32: "*i32",
        torch.int64: "*i64"}
_OPTIONS = ("num_warps", "num_stages")
_LAUNCH_ONLY = ("launch_pdl",)  # how a launch is made, not part of the compiled kernel
H100_SHARED = 232448  # bytes of shared memory one block may use on sm_90


def record_launches(calls) -> list[tuple[Kernel, dict[str, Any], dict[str, Any]]]:
    """Run ``calls()`` with every kernel launch recorded instead of executed."""
    launches = []

    def pick(self: Kernel, args):
        class At:
            def __getitem__(_, grid):
                def launch(*a, **kw):
                    names = self.fn.__code__.co_varnames[:self.fn.__code__.co_argcount]
                    bound = dict(zip(names, a, strict=False))
                    bound.update({k: v for k, v in kw.items() if k not in _OPTIONS + _LAUNCH_ONLY})
                    launches.append((self, bound, {k: v for k, v in kw.items() if k in _OPTIONS}))
                return launch
        return At()

    saved = Kernel._pick
    Kernel._pick = pick
    try:
        calls()
    finally:
        Kernel._pick = saved
    return launches


def compile_sm90(kern: Kernel, bound: dict[str, Any], options: dict[str, Any]) -> Any:
    """Lower one recorded launch to a Hopper cubin; raises on any compile error."""
    jit = triton.jit(kern.fn, do_not_specialize=kern.do_not_specialize)
    signature, constexprs = {}, {}
    for name, value in bound.items():
        if "constexpr" in str(kern.fn.__annotations__.get(name, "")):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _PTR[value.dtype]
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            signature[name] = "fp32"
    return triton.compile(ASTSource(jit, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=dict(options))


def _all_calls(dtype: torch.dtype, attention_only: bool) -> None:
    i32 = torch.int32
    q = torch.zeros(3, 8, 128, dtype=dtype)
    cache = torch.zeros(64, 2, 128, dtype=dtype)
    tables, lens = torch.zeros(3, 4, dtype=i32), torch.ones(3, dtype=i32)
    K.paged_decode_attention(q, cache, cache, tables, lens, 16, 0.1, sliding_window=20, max_seq_len=40)
    K.paged_prefill_attention(q, cache, cache, torch.tensor([0, 1, 2, 3], dtype=i32), lens, lens * 0, tables,
                              16, 0.1, sliding_window=20, max_query_len=1, block_m=64, block_n=64)
    if attention_only:  # float32 also at head_dim 256 (the widest tiles must still fit)
        wide = torch.zeros(3, 8, 256, dtype=dtype)
        K.paged_decode_attention(wide, torch.zeros(64, 2, 256, dtype=dtype), torch.zeros(64, 2, 256, dtype=dtype),
                                 tables, lens, 16, 0.1, max_seq_len=40)
        return
    K.write_kv_cache(q[:, :2], q[:, :2], cache, cache, torch.zeros(3, dtype=torch.int64))
    K.write_kv_cache(q[:1, :2], q[:1, :2], cache, cache, torch.zeros(1, dtype=torch.int64), pdl=True)
    K.paged_decode_attention(q[:1], cache, cache, tables[:1], lens[:1], 16, 0.1, max_seq_len=40, pdl=True)
    K.paged_decode_attention(q[:1], cache, cache, tables[:1], lens[:1], 16, 0.1, max_seq_len=40, split_size=128,
                             pdl=True, merge_in_pass=True)  # one tile a split: block-table entries read before the wait
    K.rms_norm(q[:, 0], torch.zeros(128, dtype=dtype), 1e-6, q[:, 1])
    K.rms_norm(q, torch.zeros(128, dtype=dtype), 1e-6)
    K.apply_rotary(q, q[:, :2], cache[:, 0], cache[:, 0], torch.zeros(3, dtype=torch.int64))
    K.apply_rotary(q, q[:, :2], cache[:, 0], cache[:, 0], torch.zeros(3, dtype=torch.int64),
                   torch.zeros(128, dtype=dtype), torch.zeros(128, dtype=dtype), 1e-6)
    K.silu_and_mul(q[:, :2].reshape(3, 256))
    x, w, nw = torch.zeros(1, 256, dtype=dtype), torch.zeros(64, 256, dtype=dtype), torch.zeros(256, dtype=dtype)
    K.gemv(x, w, norm_weight=nw, pdl=True)  # programmatic dependent launch: the grid-dependency waits
    K.gemv(x, w, residual=torch.zeros(1, 64, dtype=dtype), config=K.GemvConfig(4, 64, 2))  # split-K hand-off
    K.gemv(x, w, norm_weight=nw, silu_mul=True)
    K.gemv_qkv_rotary(x, w, nw, 1e-6, cache[:, 0, :16], cache[:, 0, :16], torch.zeros(1, dtype=torch.int64), 2, 1,
                      torch.zeros(16, dtype=dtype), torch.zeros(16, dtype=dtype), 1e-6, pdl=True)
    kv = torch.zeros(64, 1, 16, dtype=dtype)  # the key and value written into the cache too
    K.gemv_qkv_rotary(x, w, nw, 1e-6, cache[:, 0, :16], cache[:, 0, :16], torch.zeros(1, dtype=torch.int64), 2, 1,
                      pdl=True, kv_cache=(kv, kv, torch.zeros(1, dtype=torch.int64)))
    K.argmax(torch.zeros(2, 5000, dtype=dtype), chunk=4096)  # (without a chunk, 5,000 goes to torch's)
    K.argmax_prob(torch.zeros(2, 5000, dtype=dtype))  # with the softmax probability
    K.argmax(torch.zeros(1, 5000, dtype=dtype), chunk=4096, pdl=True)
    K.embedding(torch.zeros(2, dtype=torch.int64), torch.zeros(10, 256, dtype=dtype), pdl=True)
    K.gemv(x, w, evict="evict_last")  # the L2 hints on the weights' loads
    xs = torch.zeros(3, 256, dtype=dtype)  # a few rows: the tensor-core tile, each mode
    K.gemv_rows(xs, w, norm_weight=nw, pdl=True)
    K.gemv_rows(xs, w, residual=torch.zeros(3, 64, dtype=dtype), evict="evict_first")
    K.gemv_rows(xs, w, norm_weight=nw, silu_mul=True)
    K.gemv_rows_qkv_rotary(xs, torch.zeros(4 * 32, 256, dtype=dtype), nw, 1e-6, torch.zeros(64, 32, dtype=dtype),
                           torch.zeros(64, 32, dtype=dtype), torch.zeros(3, dtype=torch.int64), 2, 1,
                           torch.zeros(32, dtype=dtype), torch.zeros(32, dtype=dtype), 1e-6, pdl=True,
                           kv_cache=(torch.zeros(64, 1, 32, dtype=dtype),) * 2 + (torch.zeros(3, dtype=torch.int64),))
    K.gemv_rows(xs.float(), w.float())  # float32: the dot without TF32
    K.gemv(x, w, evict="evict_first")
    _moe_calls(dtype)
    K.resolve_placeholders(torch.tensor([-1, 3]), torch.tensor([7]))
    K.stage_inputs(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32),
                   torch.zeros(32, dtype=torch.uint8), 1, torch.tensor([7]))
    K.stage_inputs(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32),
                   torch.zeros(32, dtype=torch.uint8), 1, torch.tensor([7]), pdl=True)


def _moe_calls(dtype: torch.dtype) -> None:
    """The fused MoE at each of its default sm90 tiles (decode, medium, large batches), its alignment
    kernel, and the routing."""
    from deepinfer_kernels.fused_moe import default_config

    e, d, inter = 8, 256, 192  # I not a multiple of the widest tile: the column masks
    x = torch.zeros(4, d, dtype=dtype)
    w13, w2 = torch.zeros(e, 2 * inter, d, dtype=dtype), torch.zeros(e, d, inter, dtype=dtype)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    for per_expert in (1, 64, 1024):
        cfg = default_config(per_expert * e, e, torch.device("cuda"))  # (no CUDA call: the tiles only)
        K.fused_moe(x, w13, w2, torch.zeros(4, 2), ids, config=cfg)
    K.moe_align(torch.zeros(4, 8, dtype=torch.int32), 256, 16)  # DeepSeek-V3's 256 experts: the narrowest chunk
    K.moe_align(torch.zeros(4, 8, dtype=torch.int32), 256, 16, one_program_chunks=0)  # the three-launch path
    K.moe_align(torch.zeros(4, 6, dtype=torch.int32), 64, 64, one_program_chunks=0)
    logits = torch.zeros(3, 256, dtype=torch.float32)
    K.grouped_topk(logits, 8, scoring="sigmoid", n_group=8, topk_group=4, correction_bias=torch.zeros(256),
                   renormalize=True, routed_scaling_factor=2.5)  # DeepSeek-V3
    K.grouped_topk(logits[:, :64].to(dtype), 6)  # DeepSeek-V2-Lite


def main() -> int:
    if K.triton_interpreted():
        print("triton was imported with TRITON_INTERPRET=1; run this without it", file=sys.stderr)
        return 2
    launches = record_launches(lambda: (_all_calls(torch.bfloat16, False), _all_calls(torch.float32, True)))
    for kern, bound, options in launches:
        compiled = compile_sm90(kern, bound, options)
        shared = compiled.metadata.shared
        print(f"compiled {kern.fn.__name__} for sm_90: {shared} bytes of shared memory")
        if shared > H100_SHARED:
            print(f"{kern.fn.__name__} needs {shared} bytes of shared memory; sm_90 has {H100_SHARED}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
