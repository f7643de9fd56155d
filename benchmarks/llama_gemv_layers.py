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


def paged_context(ctx: int, dev: torch.device, dt: torch.dtype, page: int = 16) -> tuple:
    """One sequence of ``ctx`` cached tokens in shuffled pages, for each of the 16 layers' caches:
    (block table [1, pages], length [1], the new token's position [1] and slot [1], caches)."""
    pages = -(-ctx // page) + 1
    tables = torch.randperm(pages * 2, generator=torch.Generator().manual_seed(0))[:pages].to(torch.int32)
    tables = tables.reshape(1, -1).to(dev)
    lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    pos = torch.tensor([ctx - 1], device=dev)
    slot = (tables[0, (ctx - 1) // page].long() * page + (ctx - 1) % page).reshape(1)
    caches = [(torch.randn(pages * 2 * page, KV, D, device=dev, dtype=dt),
               torch.randn(pages * 2 * page, KV, D, device=dev, dtype=dt)) for _ in range(LAYERS)]
    return tables, lens, pos, slot, caches


def per_length(one_length, ctx_list: str, out_name: str) -> None:
    """``one_length(ctx, lines)`` for each comma-separated context length; the lines to $OUT/out_name."""
    import os

    lines: list[str] = []
    for n in [int(c) for c in ctx_list.split(",")]:
        one_length(n, lines)
    with open(os.path.join(os.environ.get("OUT", "."), out_name), "w") as f:
        f.write("\n".join(lines) + "\n")


def layer_tiles(dev: torch.device) -> dict:
    """default_config's tiles for the four projections of these layers."""
    from deepinfer_kernels.gemv import default_config

    return {"qkv": default_config(H * D // 2 + KV * D, HID, dev, paired=True, row_quantum=D // 2),
            "o": default_config(HID, H * D, dev), "gu": default_config(INTER, HID, dev, paired=True),
            "down": default_config(HID, INTER, dev)}
