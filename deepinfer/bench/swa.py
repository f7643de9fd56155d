"""`deepinfer bench swa`: bounded replay of sliding-window layers on multi-turn conversations.

Each configuration serves the same workload: conversations whose every turn extends the previous
one (and some of whose turns branch off mid-context, as an edited message does), all
conversations' turns sent together. Rows: `prefix-cache` alone (every layer's KV kept, nothing
replayed), `swa-replay` with R in --intervals, and `swa-replay` with no checkpoints (R past the
context: every hit replays from token 0).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.core.sampling_params import SamplingParams

HYBRID = ("sliding_attention",) * 3 + ("full_attention",)


def add_swa_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("swa", help="swa-replay: replayed tokens, prefill compute and kept bytes per interval R")
    add_engine_args(b)
    b.add_argument("--random-model", default="qwen3-tiny",
                   help="random model of this shape (qwen3-tiny, qwen3-0.6b), made hybrid: 3 sliding-window "
                        "layers to 1 full-attention layer (ignored when a model directory is given)")
    b.add_argument("--window", type=int, default=128, help="sliding window of the random model")
    b.add_argument("--intervals", default="64,128,256,512", help="replay intervals R to compare")
    b.add_argument("--context", type=int, default=1024, help="tokens of a conversation at its last turn")
    b.add_argument("--turns", type=int, default=4)
    b.add_argument("--conversations", type=int, default=4)
    b.add_argument("--branch", type=float, default=0.3, help="chance a turn branches off mid-context")
    b.add_argument("--output-len", type=int, default=8)
    b.add_argument("--sliding-pool-blocks", type=int, default=None,
                   help="swa-replay's sliding-window pool size (default: as many blocks as the full pool)")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_swa(a, _ov(a)))


class Conversations:
    """The multi-turn workload: turn t of a conversation is its turn t-1 with the reply appended
    (or, with chance ``branch``, cut somewhere between its middle and its end, as an edited
    message is) plus new user tokens, about ``context / turns`` tokens more each turn."""

    def __init__(self, num: int, turns: int, context: int, branch: float, vocab: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.num, self.turns, self.step, self.branch, self.vocab = num, turns, context // turns, branch, vocab
        self.convs: list[list[int]] = [[] for _ in range(num)]

    def prompts(self, turn: int) -> list[list[int]]:
        rng = self.rng
        for ctx in self.convs:
            if turn and rng.random() < self.branch:
                del ctx[rng.randrange(len(ctx) // 2, len(ctx)):]
            target = max(len(ctx) + 1, self.step * (turn + 1) + rng.randrange(-self.step // 4, self.step // 4 + 1))
            ctx.extend(rng.randrange(10, self.vocab) for _ in range(target - len(ctx)))
        return [list(c) for c in self.convs]

    def replies(self, outputs: list[list[int]]) -> None:
        for ctx, out in zip(self.convs, outputs, strict=True):
            ctx.extend(out)


@dataclass(slots=True)
class Row:
    label: str
    seconds: float
    requests: int
    hits: int
    replayed: float
    computed: float
    kept_bytes: float
    cached_tokens: float
    outcomes: str  # hits resumed from the nearest checkpoint / an older one / token 0


def _run(model: str, label: str, plugins: list[str], options: dict, args, vocab: int, overrides: dict) -> Row:
    from deepinfer.llm import LLM

    llm = LLM(model, config_file=args.config_file, progress=False, plugins=plugins, plugin_options=options,
              **overrides)
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    work = Conversations(args.conversations, args.turns, args.context, args.branch, vocab)
    t = time.perf_counter()
    for turn in range(args.turns):
        outs = llm.generate([{"prompt_token_ids": p} for p in work.prompts(turn)], params, use_tqdm=False)
        work.replies([o.outputs[0].token_ids for o in outs])
    seconds = time.perf_counter() - t
    m = llm.get_metrics()
    requests = args.conversations * args.turns
    cached_tokens = m.get("deepinfer:prefix_cache_cached_blocks", 0) * eng.config.block_size
    if "swa-replay" in plugins:
        kept = m["deepinfer:swa_replay_kept_bytes"]
        counts = [int(m[f"deepinfer:swa_replay_{k}"]) for k in ("restores", "older_restores", "misses")]
        hits, outcomes = sum(counts), "/".join(map(str, counts))
    else:  # prefix-cache alone keeps the sliding-window layers' KV of every cached token
        sliding = [s for s in eng.ctx.layers if s.sliding_window is not None]
        per_block = eng.runner.attention.kv_cache_bytes_per_block(sliding, eng.config.block_size, eng.ctx.dtype)
        kept = cached_tokens / eng.config.block_size * per_block
        hits, outcomes = args.conversations * (args.turns - 1), "-"
    return Row(label, seconds, requests, int(hits), m.get("deepinfer:swa_replay_tokens", 0),
               m["deepinfer:prompt_tokens_computed"], kept, cached_tokens, outcomes)


def run_swa(args, overrides: dict) -> int:
    from deepinfer.bench.models import build_random_model
    from deepinfer.bench.prefix import _release_memory

    overrides = dict(overrides)
    model = overrides.pop("model", None)
    extra = [p for p in (overrides.pop("plugins", None) or "").split(",") if p and p not in ("prefix-cache",
                                                                                           "swa-replay")]
    overrides.setdefault("dtype", "float32")
    overrides.setdefault("block_size", 16)
    overrides.setdefault("max_model_len", args.context + args.context // args.turns + args.output_len * args.turns)
    import torch

    on_gpu = overrides.get("device", "auto") != "cpu" and torch.cuda.is_available()
    if model is None:
        model = build_random_model(args.random_model, overrides["dtype"], "cuda" if on_gpu else "cpu",
                                   hybrid_window=args.window, max_position_embeddings=overrides["max_model_len"])
    bs = overrides["block_size"]
    if not on_gpu and "kv_cache_memory_gb" not in overrides:
        # room for every turn of every conversation: no eviction, and no 1 GiB pools to zero on a CPU
        overrides.setdefault("num_kv_blocks", args.conversations * args.turns * -(-overrides["max_model_len"] // bs))
    intervals = [int(r) for r in args.intervals.split(",") if r]
    never = -(-overrides["max_model_len"] // bs) * bs + bs  # past every context: no checkpoint is ever taken
    configs = [("prefix-cache (baseline)", ["prefix-cache"], {})]
    pool = {} if args.sliding_pool_blocks is None else {"sliding_pool_blocks": args.sliding_pool_blocks}
    configs += [(f"swa-replay R={r}", ["prefix-cache", "swa-replay"], {"swa-replay": {"replay_interval": r, **pool}})
                for r in intervals]
    configs.append(("swa-replay, no checkpoints", ["prefix-cache", "swa-replay"],
                    {"swa-replay": {"replay_interval": never, **pool}}))
    vocab, args.window = _model_facts(model)
    rows = []
    for label, plugins, options in configs:
        rows.append(_run(model, label, extra + plugins, options, args, vocab, overrides))
        progress(f"swa {label}: {rows[-1].seconds:.2f} s")
        _release_memory()
    args.dtype_used = overrides["dtype"]
    report(args, rows)
    return 0


def _model_facts(model: str) -> tuple[int, int | None]:
    """Vocabulary size and sliding window of a model directory."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(model) / "config.json").read_text())
    return int(cfg["vocab_size"]), cfg.get("sliding_window")


def report(args, rows: list[Row]) -> None:
    import platform

    import torch

    print(f"deepinfer bench swa: {args.conversations} conversations x {args.turns} turns to {args.context} tokens, "
          f"branch {args.branch:.0%}, window {args.window}, {args.output_len} output tokens, {args.dtype_used}; "
          f"torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}")
    pool = "" if args.sliding_pool_blocks is None else f"; sliding pool {args.sliding_pool_blocks} blocks"
    print(f"hits resumed from the nearest checkpoint / an older one / token 0 in 'near/old/0'{pool}")
    print(f"{'':<28}{'replayed/hit':>13}{'prefill/req':>13}{'kept SWA MiB':>14}{'B/cached tok':>14}{'seconds':>9}"
          f"{'near/old/0':>12}")
    for r in rows:
        per_hit = r.replayed / r.hits if r.hits else 0.0
        per_tok = r.kept_bytes / r.cached_tokens if r.cached_tokens else 0.0
        print(f"{r.label:<28}{per_hit:>13.1f}{r.computed / r.requests:>13.1f}{r.kept_bytes / 2**20:>14.2f}"
              f"{per_tok:>14.1f}{r.seconds:>9.2f}{r.outcomes:>12}")
    write_json(args, [{"name": r.label, **{k: getattr(r, k) for k in Row.__slots__ if k != "label"}} for r in rows])
