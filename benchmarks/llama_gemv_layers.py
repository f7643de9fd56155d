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


class Launch:
    """A kernel launched as its wrapper launches it, with some launch arguments replaced
    (``changes``; only in launches where ``when(kwargs)`` holds, if given): what
    :func:`layer_chain` puts in place of decode attention's pass 1 or of the GEMV kernel."""

    def __init__(self, kern, when=None, **changes) -> None:
        self.kern, self.when, self.changes = kern, when, changes

    def __getitem__(self, grid):
        launch = self.kern[grid]

        def run(*args, **kwargs):
            use = self.when is None or self.when(kwargs)
            return launch(*args, **({**kwargs, **self.changes} if use else kwargs))

        return run


def attention_pass(kern=None, **changes) -> Launch:
    """Decode attention's pass 1 (``kern``, default the package's own) with ``changes``."""
    import deepinfer_kernels.paged_attention as pa

    return Launch(kern or pa._decode_split_kernel, **changes)


def layer_chain(inputs: dict, ctx: tuple, res, caches, tiles: dict, max_seq_len: int, pass_one: Launch | None = None,
                o_tile=None, evict: str = "", page: int = 16, prefetch_mb: float = 0.0,
                gemv_kernel: Launch | None = None):
    """The 16 layers of one token as a batch-1 step runs them, with PDL: qkv writing the cache,
    decode attention merging in pass 1 (splits of 128, partials sized for ``max_seq_len``; its pass 1
    replaced by ``pass_one``), o, gate/up, down (the GEMV kernel replaced by ``gemv_kernel``);
    ``ctx`` is :func:`paged_context`'s output, ``res`` the residual row (updated in place and
    returned), ``caches`` the layers' (k, v); ``prefetch_mb``: the qkv kernel pulls that many MB of
    gate/up's first rows (both halves) into the L2 (the ``l2_prefetch`` argument of 4f7db5d's
    kernel, reverted after: it was slower)."""
    import sys

    import deepinfer_kernels as dk

    pa, gm = sys.modules["deepinfer_kernels.paged_attention"], sys.modules["deepinfer_kernels.gemv"]
    tables, lens, pos, slot, _ = ctx
    real_pa, real_gm = pa._decode_split_kernel, gm._gemv_kernel
    pa._decode_split_kernel, gm._gemv_kernel = pass_one or real_pa, gemv_kernel or real_gm
    try:
        rows = min(INTER, int(prefetch_mb * 1e6) // (2 * HID * 2))
        for ly, c in zip(inputs["layers"], caches):
            pf = {"l2_prefetch": (ly["gu"][:rows], ly["gu"][INTER:INTER + rows])} if rows else {}
            qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, inputs["cos"], inputs["sin"], pos, H, KV,
                                     config=tiles["qkv"], pdl=True, kv_cache=(c[0], c[1], slot), evict=evict, **pf)
            at = dk.paged_decode_attention(qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, page, D ** -0.5,
                                           None, max_seq_len, 128, pdl=True, merge_in_pass=True)
            dk.gemv(at.reshape(1, H * D), ly["o"], residual=res, config=o_tile or tiles["o"], pdl=True, evict=evict)
            act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=tiles["gu"], pdl=True,
                          evict=evict)
            dk.gemv(act, ly["down"], residual=res, config=tiles["down"], pdl=True, evict=evict)
    finally:
        pa._decode_split_kernel, gm._gemv_kernel = real_pa, real_gm
    return res


def chain_variants(variants: dict[str, dict], out_name: str, default_ctx: str = "640,1024", check: bool = True,
                   max_seq_len: int | None = 8192, evict: str = "evict_first") -> None:
    """The 16-layer benchmarks' command line (``--ctx`` key counts, comma-separated; ``--trials``) and
    run: for each length, :func:`compare_chains` of :func:`layer_chain` under each variant's keyword
    arguments (``variants``: name -> kwargs), with partials sized for ``max_seq_len`` keys (None: the
    length itself) and the weights' loads at ``evict``; the lines to $OUT/out_name."""
    import argparse

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default=default_ctx)
    ap.add_argument("--trials", type=int, default=5)
    a, _ = ap.parse_known_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)

    def one_length(ctx: int, lines: list[str]) -> None:
        at = paged_context(ctx, dev, dt)
        cap = ctx if max_seq_len is None else max_seq_len

        def run(v, res, caches):
            return layer_chain(inputs, at, res, caches, tiles, cap, **{"evict": evict, **variants[v]})

        compare_chains(run, variants, inputs, at, a.trials, lines, f"ctx {ctx}", check=check)

    per_length(one_length, a.ctx, out_name)


def compare_chains(run, variants, inputs: dict, ctx: tuple, trials: int, lines: list[str], label: str,
                   check: bool = True) -> None:
    """``run(variant, res, caches)`` for each variant: (with ``check``) one eager pass each from the
    same start, their residuals against the first's; then ``trials`` interleaved CUDA-graph timings
    of each, the median and the trials appended to ``lines`` (and printed)."""
    from graph_timing import graph_time

    caches = ctx[4]
    names = list(variants)
    start = len(lines)
    if check:
        outs = {v: run(v, inputs["res0"].clone(), [(k.clone(), x.clone()) for k, x in caches]).float()
                for v in names}
        lines.append(f"{label}: max |difference| of the residual after 16 layers from '{names[0]}': " + ", ".join(
            f"{v} {(outs[v] - outs[names[0]]).abs().max().item():.3g}" for v in names))
    times = {v: [] for v in names}
    state = {v: (inputs["res0"].clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in names}
    for _ in range(trials):
        for v in names:
            times[v].append(graph_time(lambda v=v: run(v, *state[v])))
    for v in names:
        med = sorted(times[v])[trials // 2]
        lines.append(f"{label}: {v:28s} 16 layers {med:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in times[v])})")
    print("\n".join(lines[start:]), flush=True)
