"""H200: the fused single-token decoder layer (kernels/decode_layer.py) against the chain of
single-token kernels it replaces (qkv GEMV, KV write, two decode-attention passes, o, gate/up,
down GEMVs), for 16 Llama-3.2-1B-shaped layers (distinct weights, bf16, 640 cached tokens), each
as one CUDA graph; then a sweep of the fused layer's tiles. First a correctness check of one
layer against the torch reference (Llama and Qwen3 shapes, bf16 and float32).
Writes $OUT/decode_layer.txt. Optional argument: "quick" (the check and the default tiles only)."""
import os
import sys

import torch
from graph_timing import graph_time

import deepinfer_kernels as dk
from deepinfer_kernels.decode_layer import (
    LayerConfig,
    LayerWeights,
    PagedKV,
    decode_layer,
    decode_layer_ref,
    default_layer_config,
)

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
quick = sys.argv[1:] == ["quick"]
lines = []
import deepinfer_kernels.decode_layer as dl  # noqa: E402

REGS = {}


class _Recording:
    """Notes each compiled variant's registers and spills (from the launch's return value)."""

    def __init__(self, kern):
        self.kern = kern

    def __getitem__(self, grid):
        launch = self.kern[grid]

        def run(*args, **kwargs):
            ck = launch(*args, **kwargs)
            key = tuple(kwargs.get(k) for k in ("BQ", "BKQ", "BO", "BKO", "BG", "BKG", "BD", "BKD", "num_warps"))
            if key not in REGS and hasattr(ck, "n_regs"):
                REGS[key] = (ck.n_regs, ck.n_spills)
                print(f"  registers {key}: {ck.n_regs}, spills {ck.n_spills}", flush=True)
            return ck
        return run


dl._decode_layer_kernel = _Recording(dl._decode_layer_kernel)


def log(s):
    lines.append(s)
    print(s, flush=True)


def make(hid, inter, h, kv, d, qk_norm, dt, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)

    def r(*shape, s=0.02):
        return (torch.randn(*shape, device=dev, generator=g) * s).to(dt)

    return LayerWeights(r((h + 2 * kv) * d, hid), r(hid, h * d), r(2 * inter, hid), r(hid, inter),
                        1 + r(hid, s=0.1), 1 + r(hid, s=0.1), 1e-5,
                        1 + r(d, s=0.1) if qk_norm else None, 1 + r(d, s=0.1) if qk_norm else None, 1e-6)


def paged(kv, d, dt, seq_len, bs=16, blocks=64):
    k = torch.randn(blocks * bs, kv, d, device=dev).to(dt)
    v = torch.randn(blocks * bs, kv, d, device=dev).to(dt)
    table = torch.randperm(blocks, device=dev).to(torch.int32)
    slot = (table[(seq_len - 1) // bs].long() * bs + (seq_len - 1) % bs).reshape(1)
    return PagedKV(k, v, slot, table, torch.tensor([seq_len], dtype=torch.int32, device=dev), bs, d ** -0.5)


def rot(d, dt):
    ang = torch.outer(torch.arange(2048.0), 1.0 / 500000 ** (torch.arange(0, d, 2) / d))
    return torch.cat([ang, ang], -1).cos().to(dev, dt), torch.cat([ang, ang], -1).sin().to(dev, dt)


SHAPES = {"llama-1b": (2048, 8192, 32, 8, 64, False), "qwen3-0.6b": (1024, 3072, 16, 8, 128, True)}

log("One layer against decode_layer_ref (max |difference| of the residual; of the written key/value):")
for name, (hid, inter, h, kv, d, qkn) in SHAPES.items():
    for dt in (torch.float32, torch.bfloat16):
        for seq_len, window in ((640, None), (1, None), (900, 128)):
            w = make(hid, inter, h, kv, d, qkn, dt)
            cos, sin = rot(d, dt)
            res = torch.randn(1, hid, device=dev).to(dt)
            got_kv = paged(kv, d, dt, seq_len)
            got_kv = PagedKV(**{**got_kv.__dict__, "sliding_window": window})
            ref_kv = PagedKV(**{**got_kv.__dict__, "k_cache": got_kv.k_cache.clone(), "v_cache": got_kv.v_cache.clone()})
            pos = torch.tensor([seq_len - 1], device=dev)
            got = decode_layer(res.clone(), w, h, kv, cos, sin, pos, got_kv, pdl=True)
            want = decode_layer_ref(res.clone(), w, h, kv, cos, sin, pos, ref_kv)
            diff = (got.float() - want.float()).abs().max().item()
            kd = max((got_kv.k_cache.float() - ref_kv.k_cache.float()).abs().max().item(),
                     (got_kv.v_cache.float() - ref_kv.v_cache.float()).abs().max().item())
            log(f"  {name:10s} {str(dt):15s} len {seq_len:4d} window {window}: {diff:.3g}; kv {kd:.3g}")

HID, INTER, H, KV, D = 2048, 8192, 32, 8, 64
LAYERS, SEQ = 16, 640
dt = torch.bfloat16
layers = [make(HID, INTER, H, KV, D, False, dt, seed=i) for i in range(LAYERS)]
caches = [paged(KV, D, dt, SEQ) for _ in range(LAYERS)]
cos, sin = rot(D, dt)
pos = torch.tensor([SEQ - 1], device=dev)
res0 = torch.randn(1, HID, device=dev).to(dt)
weight_mb = sum(t.numel() * t.element_size() for w in layers for t in (w.qkv, w.o, w.gate_up, w.down)) / 1e6


def chain(pdl):
    res = res0.clone()
    for w, c in zip(layers, caches):
        qkv = dk.gemv_qkv_rotary(res, w.qkv, w.input_norm, w.eps, cos, sin, pos, H, KV, pdl=pdl)
        q, k, v = qkv.split([H * D, KV * D, KV * D], -1)
        dk.write_kv_cache(k.view(1, KV, D), v.view(1, KV, D), c.k_cache, c.v_cache, c.slot, pdl=pdl)
        a = dk.paged_decode_attention(q.view(1, H, D), c.k_cache, c.v_cache, c.block_table[None], c.seq_len,
                                      c.block_size, c.scale, None, SEQ, pdl=pdl)
        dk.gemv(a.view(1, H * D), w.o, residual=res, pdl=pdl)
        act = dk.gemv(res, w.gate_up, norm_weight=w.post_norm, eps=w.eps, silu_mul=True, pdl=pdl)
        dk.gemv(act, w.down, residual=res, pdl=pdl)
    return res


def fused(pdl, cfg=None):
    res = res0.clone()
    for i, (w, c) in enumerate(zip(layers, caches)):
        decode_layer(res, w, H, KV, cos, sin, pos, c, parity=i, config=cfg, pdl=pdl,
                     next_weights=layers[i + 1] if i + 1 < LAYERS else None)
    return res


a, b, c = chain(True), fused(True), fused(False)
log(f"16 layers: fused (PDL) vs chain max |difference| {(a.float() - b.float()).abs().max().item():.3g}; "
    f"fused PDL on/off equal: {torch.equal(b, c)}")
log(f"16 Llama-3.2-1B layers, {weight_mb:.0f} MB of weights, {SEQ} cached tokens, one graph (device time):")
for name, fn in (("chain of single-token kernels, PDL", lambda: chain(True)),
                 ("fused layer, PDL", lambda: fused(True)),
                 ("fused layer, no PDL", lambda: fused(False))):
    t = graph_time(fn)
    log(f"  {name:36s} {t:8.1f} us  {weight_mb / t:.2f} TB/s")
default = default_layer_config(HID, H, D, INTER, False, dev)
log(f"default config: {default}")
if not quick:
    d = default
    variants = [LayerConfig(d.qkv, d.o, d.gate_up, d.down, 32, 16, warps, 0.0, tickets, spin)
                for warps in (4, 8) for tickets in (True, False) for spin in (False, True)]
    variants += [LayerConfig((4, 2048), (8, 2048), (4, 2048), (4, 2048), 32, 16, 8, 0.0, tickets, True)
                 for tickets in (True, False)]
    for cfg in variants:
        try:
            t = graph_time(lambda cfg=cfg: fused(True, cfg))
            diff = (fused(True, cfg).float() - b.float()).abs().max().item()
            log(f"  {str(cfg):100s} {t:8.1f} us  {weight_mb / t:.2f} TB/s  (vs default: {diff:.3g})")
        except Exception as exc:  # noqa: BLE001  (a tile that does not compile: report, go on)
            log(f"  {str(cfg):100s} failed: {type(exc).__name__}: {str(exc)[:120]}")
log(f"registers, spills per tile set: {REGS}")
with open(f"{out_dir}/decode_layer.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
