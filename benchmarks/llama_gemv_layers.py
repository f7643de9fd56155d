"""The single-token projections' inputs for the GEMV benchmarks: 16 Llama-3.2-1B-shaped layers of
distinct random bf16 weights (qkv, o, gate|up, down and the two norms), rotary tables, a position
and a residual row, seeded."""
import torch

HID, INTER, H, KV, D, LAYERS = 2048, 8192, 32, 8, 64, 16


def llama_layers(dev: torch.device, dt: torch.dtype = torch.bfloat16) -> dict:
    torch.manual_seed(0)
    layers = [{"qkv": torch.randn((H + 2 * KV) * D, HID, device=dev, dtype=dt) * 0.02,
               "o": torch.randn(HID, H * D, device=dev, dtype=dt) * 0.02,
               "gu": torch.randn(2 * INTER, HID, device=dev, dtype=dt) * 0.02,
               "down": torch.randn(HID, INTER, device=dev, dtype=dt) * 0.02,
               "n1": torch.rand(HID, device=dev, dtype=dt) + 0.5, "n2": torch.rand(HID, device=dev, dtype=dt) + 0.5}
              for _ in range(LAYERS)]
    ang = torch.outer(torch.arange(1024.0), torch.rand(D // 2))
    return {"layers": layers, "cos": torch.cat([ang, ang], -1).cos().to(dev, dt),
            "sin": torch.cat([ang, ang], -1).sin().to(dev, dt), "pos": torch.tensor([600], device=dev),
            "res0": torch.randn(1, HID, device=dev, dtype=dt)}
