"""H200: tiles of the single-token GEMV kernels on the Llama-3.2-1B shapes (bf16), against cuBLAS
plus the small kernels they replace. Times CUDA-graph replays of 20 launches that cycle through
copies of the weight adding up to 200 MB or more (a decode step reads every weight once: none of
them is in the 50 MB L2 when it is read); writes $OUT/gemv_sweep.txt and $OUT/gemv_best.json."""
import itertools
import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from graph_timing import graph_time as _graph_time

import deepinfer_kernels as dk
from deepinfer_kernels import GemvConfig
from deepinfer_kernels.gemv import default_config

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
dt = torch.bfloat16
torch.manual_seed(0)
HID, INTER, H, KV, D = 2048, 8192, 32, 8, 64
REPS = 20


def graph_time(fn):
    """Median device time of one fn() call, from graph replays of REPS calls."""
    return _graph_time(fn, reps=REPS, trials=15)


x = torch.randn(1, HID, device=dev, dtype=dt)
xi = torch.randn(1, INTER, device=dev, dtype=dt) * 0.1
nw = torch.rand(HID, device=dev, dtype=dt) + 0.5


class Cycle:
    """Copies of one weight, handed out in turn (each call of a case reads the next copy)."""

    def __init__(self, rows, cols):
        w = torch.randn(rows, cols, device=dev, dtype=dt) * 0.02
        n = max(2, -(-200_000_000 // (w.numel() * w.element_size())))
        self.copies = [w] + [w.clone() for _ in range(n - 1)]
        self.i = 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.copies)
        return self.copies[self.i]


c_qkv, c_o, c_gu, c_down = Cycle((H + 2 * KV) * D, HID), Cycle(HID, H * D), Cycle(2 * INTER, HID), Cycle(HID, INTER)
w_qkv, w_o, w_gu, w_down = (c.copies[0] for c in (c_qkv, c_o, c_gu, c_down))
c_lm = Cycle(128256, HID)
logits = torch.randn(1, 128256, device=dev, dtype=dt)
res = torch.randn(1, HID, device=dev, dtype=dt)
ang = torch.outer(torch.arange(1024.0), torch.rand(D // 2))
cos = torch.cat([ang, ang], -1).cos().to(dev, dt)
sin = torch.cat([ang, ang], -1).sin().to(dev, dt)
pos = torch.tensor([600], device=dev)

cases = {
    "qkv_rotary": (w_qkv, lambda cfg: dk.gemv_qkv_rotary(x, c_qkv(), nw, 1e-5, cos, sin, pos, H, KV, config=cfg),
                   lambda: dk.apply_rotary(*[t.view(1, -1, D) for t in F.linear(dk.rms_norm(x, nw, 1e-5), c_qkv())
                                             .split([H * D, KV * D, KV * D], -1)[:2]], cos, sin, pos)),
    "o_residual": (w_o, lambda cfg: dk.gemv(x, c_o(), residual=res, config=cfg),
                   lambda: dk.rms_norm(F.linear(x, c_o()), nw, 1e-5, res)),
    "gate_up_silu": (w_gu, lambda cfg: dk.gemv(x, c_gu(), norm_weight=nw, eps=1e-5, silu_mul=True, config=cfg),
                     lambda: dk.silu_and_mul(F.linear(dk.rms_norm(x, nw, 1e-5, res)[0], c_gu()))),
    "down_residual": (w_down, lambda cfg: dk.gemv(xi, c_down(), residual=res, config=cfg),
                      lambda: F.linear(xi, c_down())),
}
lines, best = [], {}
# correctness first: each fused kernel against its eager reference, bf16
checks = {
    "qkv_rotary": (dk.gemv_qkv_rotary(x, w_qkv, nw, 1e-5, cos, sin, pos, H, KV),
                   dk.gemv_qkv_rotary_ref(x, w_qkv, nw, 1e-5, cos, sin, pos, H, KV)),
    "gate_up_silu": (dk.gemv(x, w_gu, norm_weight=nw, eps=1e-5, silu_mul=True),
                     dk.gemv_ref(x, w_gu, norm_weight=nw, eps=1e-5, silu_mul=True)),
    "down_residual": (dk.gemv(xi, w_down, residual=res.clone()), dk.gemv_ref(xi, w_down, residual=res.clone())),
}
for name, (got, want) in checks.items():
    err = (got.float() - want.float()).abs().max().item()
    lines.append(f"check {name}: max abs err {err:.4g} (scale {want.float().abs().max().item():.3g})")
same = dk.argmax(logits).item() == logits.argmax(-1).item()
lines.append(f"argmax [1, 128256] bf16: fused {graph_time(lambda: dk.argmax(logits)):.2f} us, torch "
             f"{graph_time(lambda: logits.argmax(-1)):.2f} us, same index: {same}")
lines.append(f"LM head [128256, 2048] cuBLAS: {graph_time(lambda: F.linear(x, c_lm())):.2f} us; GEMV default "
             f"{graph_time(lambda: dk.gemv(x, c_lm())):.2f} us")
print("\n".join(lines), flush=True)
for name, (w, fused, eager) in cases.items():
    mb = w.numel() * w.element_size() / 1e6
    t_eager = graph_time(eager)
    paired = name in ("gate_up_silu", "qkv_rotary")
    cfg0 = default_config(w.shape[0] // (2 if paired else 1), w.shape[1], dev, paired=paired,
                          row_quantum=D // 2 if name == "qkv_rotary" else None)
    t_def = graph_time(partial(fused, None))
    lines.append(f"{name}: {mb:.1f} MB; cuBLAS + small kernels {t_eager:.2f} us ({mb / t_eager:.2f} TB/s); "
                 f"default {cfg0} {t_def:.2f} us ({mb / t_def:.2f} TB/s)")
    results = []
    for bn, bk, sk, nwarps in itertools.product([1, 2, 4, 8] if paired else [1, 2, 4, 8, 16],
                                                [128, 256, 512] if paired else [256, 512, 1024, 2048],
                                                [1, 2, 4, 8], [2, 4]):
        if name == "qkv_rotary" and (D // 2) % bn:
            continue
        if w.shape[1] // sk < bk:
            continue
        cfg = GemvConfig(bn, bk, sk, nwarps)
        try:
            results.append((graph_time(partial(fused, cfg)), cfg))
        except Exception as e:  # noqa: BLE001 - a tile that does not compile is reported and skipped
            lines.append(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}")
    results.sort(key=lambda r: r[0])
    for t, cfg in results[:4]:
        for nwarps in (1, 8):
            c2 = GemvConfig(cfg.block_n, cfg.block_k, cfg.split_k, nwarps)
            results.append((graph_time(partial(fused, c2)), c2))
    results.sort(key=lambda r: r[0])
    for t, cfg in results[:12]:
        lines.append(f"  {t:7.2f} us {mb / t:5.2f} TB/s  {cfg}")
    best[name] = {"us": results[0][0], "config": vars(results[0][1]), "default_us": t_def, "eager_us": t_eager}
    print("\n".join(lines[-13:]), flush=True)
with open(f"{out_dir}/gemv_sweep.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
with open(f"{out_dir}/gemv_best.json", "w") as f:
    json.dump(best, f, indent=1)
