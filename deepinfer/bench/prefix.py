"""`deepinfer bench prefix`: prefill with a long shared context, with the prefix cache and without."""
from __future__ import annotations

import random
import statistics
import time

from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.core.sampling_params import SamplingParams


def add_prefix_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("prefix", help="prefill throughput with prefix-cache over without (shared context)")
    add_engine_args(b)
    b.add_argument("--random-model", default=None, help="build a random model of this shape instead")
    b.add_argument("--shared", type=int, default=8000, help="shared context tokens per prompt")
    b.add_argument("--unique", type=int, default=320, help="unique tokens per prompt")
    b.add_argument("--num-requests", type=int, default=64)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--lookup-blocks", type=int, default=100_000,
                   help="cached blocks for the lookup-cost measurement (0: skip it)")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_prefix(a, _ov(a)))


def _prefill_seconds(llm, shared: list[int], unique: int, num: int, repeats: int, vocab: int) -> list[float]:
    """Each repeat sends new unique suffixes, so only the shared context can hit the cache."""
    params = SamplingParams(temperature=0, max_tokens=1)
    rng = random.Random(1)
    out = []
    for _ in range(repeats):
        prompts = [shared + [rng.randrange(10, vocab) for _ in range(unique)] for _ in range(num)]
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        out.append(time.perf_counter() - t)
    return out


def run_prefix(args, overrides: dict) -> int:
    from deepinfer.bench.models import bench_model
    from deepinfer.llm import LLM

    model, overrides = bench_model(args, overrides, "bfloat16")
    plugins = [p for p in (overrides.pop("plugins", None) or []) if p != "prefix-cache"]
    results = {}
    for label, extra in (("no cache", []), ("prefix-cache", ["prefix-cache"])):
        llm = LLM(model, config_file=args.config_file, progress=False, plugins=plugins + extra, **overrides)
        vocab = llm.engine.ctx.model_config["vocab_size"]
        rng = random.Random(0)
        shared = [rng.randrange(10, vocab) for _ in range(args.shared)]
        llm.generate({"prompt_token_ids": shared + [11]}, SamplingParams(max_tokens=1), use_tqdm=False)  # warm
        m0 = llm.get_metrics()
        secs = _prefill_seconds(llm, shared, args.unique, args.num_requests, args.repeats, vocab)
        m = {k: v - m0.get(k, 0) for k, v in llm.get_metrics().items()}
        tokens = args.num_requests * (args.shared + args.unique)
        results[label] = (statistics.median(secs), tokens, m.get("deepinfer:prefix_cache_hits", 0),
                          m.get("deepinfer:prefix_cache_queries", 0))
        progress(f"prefix {label}: median {results[label][0]:.3f} s of {[round(s, 3) for s in secs]}")
        del llm
        _release_memory()
    print(f"deepinfer bench prefix: {args.num_requests} requests x ({args.shared} shared + {args.unique} unique) "
          f"tokens, max_tokens=1, median of {args.repeats}")
    print(f"{'':<14}{'seconds':>10}{'prefill tok/s':>16}{'hit rate':>10}")
    for label, (s, tokens, hits, queries) in results.items():
        rate = f"{hits / queries:.1%}" if queries else "-"
        print(f"{label:<14}{s:>10.3f}{tokens / s:>16.0f}{rate:>10}")
    speedup = results["no cache"][0] / results["prefix-cache"][0]
    print(f"prefill speed-up with prefix-cache: {speedup:.1f}x "
          f"(ideal at {args.shared / (args.shared + args.unique):.0%} hits: "
          f"{(args.shared + args.unique) / args.unique:.1f}x)")
    lookup = lookup_cost_us(args.lookup_blocks) if args.lookup_blocks else None
    if lookup is not None:
        print(f"lookup cost at {args.lookup_blocks} cached blocks: {lookup:.2f} us/block")
    write_json(args, [{"name": label, "median_s": s, "prompt_tokens": tokens, "prompt_tok_s": tokens / s,
                       "hits": hits, "queries": queries} for label, (s, tokens, hits, queries) in results.items()]
               + ([{"name": "lookup", "blocks": args.lookup_blocks, "us_per_block": lookup}] if lookup else []))
    return 0


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def lookup_cost_us(num_cached: int, block_size: int = 16, probe_blocks: int = 512) -> float:
    """Microseconds per block of a prefix lookup (hash + dict probe + token compare) at
    ``num_cached`` cached blocks, measured on the plugin itself with a synthetic pool."""
    from deepinfer.core.block_pool import BlockPool
    from deepinfer.core.config import EngineConfig
    from deepinfer.core.context import EngineContext
    from deepinfer.core.metrics import Metrics
    from deepinfer.core.request import Request
    from deepinfer.plugins import PrefixMatch
    from deepinfer_builtin.cache.prefix_cache import PrefixCache, PrefixCacheOptions

    ctx = EngineContext(config=EngineConfig(block_size=block_size), metrics=Metrics())
    policy = PrefixCache(PrefixCacheOptions(), ctx)
    pool = BlockPool(num_cached + probe_blocks, block_size)
    rng = random.Random(0)
    chunk = 2048 // block_size
    filled = 0
    while filled < num_cached:  # many 2K-token prompts, all of their blocks cached
        n = min(chunk, num_cached - filled)
        req = Request(f"fill{filled}", [rng.randrange(50_000) for _ in range(n * block_size)], SamplingParams())
        blocks = pool.allocate(n)
        req.num_computed_tokens = n * block_size
        policy.on_computed(req, blocks)
        pool.free(reversed(blocks))
        filled += n
    probe = Request("probe", list(req.all_token_ids) + [1], SamplingParams())
    times = []
    for _ in range(5):
        probe.policy_state.clear()
        t = time.perf_counter()
        m = policy.match(probe, PrefixMatch([], 0))
        times.append(time.perf_counter() - t)
    assert m.num_tokens == len(req.all_token_ids)
    return 1e6 * statistics.median(times) / max(1, len(m.blocks))
