"""Train deepinfer's embedded demo model pair (a tiny target and its draft).

The pair is trained from scratch on the Python standard library of the
interpreter that runs this script, so the result is reproducible anywhere
with no download:

* corpus     -- the stdlib's ``.py``/``.txt``/``.rst`` files, split ~95/5;
* tokenizer  -- byte-level BPE, 8192 tokens, chat role specials;
* target     -- Qwen3, 8 layers, 3:1 sliding/full hybrid attention;
* draft      -- Qwen3, a few full-attention layers (--draft-layers), distilled from the target on the
                corpus and on the target's own greedy continuations.

Both are written as ordinary Hugging Face model directories (bf16
safetensors) with a model card; the corpus and the tokenizer are built by
``deepinfer/tools/demo_data.py``, the architectures are ``demo_models.py``, the training loop is
``demo_training.py``, the self-distillation data and the replay of speculative decoding are
``demo_distill.py``, the evaluation and the card are in ``demo_card.py``.

Usage::

    python -m deepinfer.tools.train_demo --quick --out /tmp/demo_quick
    python -m deepinfer.tools.train_demo --device cuda --out /tmp/demo --pack /tmp/pack
    python -m deepinfer.tools.train_demo --unpack /tmp/pack --out deepinfer/assets
    python -m deepinfer.tools.train_demo --draft-only --device cuda --out /tmp/demo  # a new draft
    python -m deepinfer.tools.train_demo --evaluate-only --out /tmp/demo

The script also runs as a plain file (``python deepinfer/tools/train_demo.py ...``), which needs
only torch, transformers and tokenizers: useful where the engine's own dependencies are missing.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import shutil
import sys
import time
from pathlib import Path


def _import_sibling(name: str):
    """deepinfer.tools.NAME, or the file beside this one when run as a plain script where the
    engine's own dependencies are missing (the GPU machine)."""
    import importlib

    try:
        return importlib.import_module(f"deepinfer.tools.{name}")
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        return importlib.import_module(name)


demo_data = _import_sibling("demo_data")  # the corpus and the tokenizer
demo_models = _import_sibling("demo_models")  # the two architectures
target_config, draft_config = demo_models.target_config, demo_models.draft_config
build_model, count_params = demo_models.build_model, demo_models.count_params
demo_training = _import_sibling("demo_training")  # the training loop
log, TrainSpec, train_model = demo_training.log, demo_training.TrainSpec, demo_training.train_model

TOTAL_SIZE_LIMIT = 40_000_000  # both models' safetensors together, bytes
SHARD_THRESHOLD = 15_000_000  # shard a model whose weights exceed this...
MAX_SHARD_SIZE = "14MB"  # ...into files of at most this (decimal MB)
FILE_SIZE_LIMIT = 16_000_000  # every weight file must stay under this
MODEL_DIRS = ("demo-target", "demo-draft")

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "assets"

# Default schedules. FULL's target takes about 50 s on one H200 (~400k target tokens/s) and is
# bounded by the data, not the time: the ~2.3M-token corpus is seen ~5.7 times; at 2000 steps the
# target's held-out loss rose from 2.94 (step 1000) to 3.64 (overfitting). Its draft learns the
# target's distribution only (alpha 0), on the corpus and on ~6M tokens the target wrote, for
# 6000 steps (a few minutes): draft recipes are compared in docs/benchmarks.md (issue 8, sessions
# 7 and 53: a 3-layer draft and longer continuations gained little). QUICK is a CPU smoke run.
DRAFT_SHAPE = {"self_distill_new": 192, "draft_layers": demo_models.DRAFT_LAYERS, "draft_mlp": demo_models.DRAFT_MLP}
FULL = {"steps": 800, "batch_size": 32, "seq_len": 512, "draft_steps": 6000, "warmup": 100,
        "eval_windows": 64, "eval_every": 500, "log_every": 250, "self_distill": 24576, **DRAFT_SHAPE}
QUICK = {"steps": 80, "batch_size": 4, "seq_len": 256, "draft_steps": 24, "warmup": 8,
         "eval_windows": 16, "eval_every": 0, "log_every": 10, "self_distill": 0, **DRAFT_SHAPE}
# Self-distillation: prompts of the benchmark's length, continued by --self-distill-new tokens.
SELF_DISTILL_PROMPT, SELF_DISTILL_BATCH = 64, 512
# The speculative replay of the evaluation: held-out prompts as `deepinfer bench spec` takes them.
SPEC_PROMPTS, SPEC_PROMPT_LEN, SPEC_NEW_TOKENS, SPEC_K = 64, 64, 128, 5


# ----------------------------------------------------------------------------- saving


def save_model_dir(model, tokenizer, out_dir: Path) -> dict:
    """Save a bf16 Hugging Face model directory (sharded if large) with the tokenizer files."""
    import torch

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model = model.to("cpu", dtype=torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kwargs = {}
    if weight_bytes > SHARD_THRESHOLD:
        kwargs["max_shard_size"] = MAX_SHARD_SIZE
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers 4.x; 5.x always writes safetensors
    model.save_pretrained(out_dir, **kwargs)
    demo_data.write_tokenizer_files(tokenizer, out_dir)
    files = {p.name: p.stat().st_size for p in sorted(out_dir.glob("*.safetensors"))}
    assert files, f"no safetensors written in {out_dir}"
    for name, size in files.items():
        assert size < FILE_SIZE_LIMIT, f"{out_dir / name} is {size} bytes (>= {FILE_SIZE_LIMIT})"
    config = json.loads((out_dir / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", config
    return {"dir": out_dir.name, "safetensors": files, "weight_bytes": sum(files.values())}


# ------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="deepinfer train-demo",
        description="Train the embedded demo target/draft pair on the Python stdlib.")
    p.add_argument("--out", default=str(DEFAULT_OUT),
                   help="output dir for demo-target/, demo-draft/, train_log.json (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--quick", action="store_true", help="tiny schedule for a CPU smoke run")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, help=f"target steps (default {FULL['steps']}, quick {QUICK['steps']})")
    p.add_argument("--draft-steps", type=int,
                   help=f"draft steps (default {FULL['draft_steps']}, quick {QUICK['draft_steps']})")
    p.add_argument("--batch-size", type=int, help=f"sequences per step (default {FULL['batch_size']})")
    p.add_argument("--seq-len", type=int, help=f"training sequence length (default {FULL['seq_len']})")
    p.add_argument("--lr", type=float, default=2e-3, help="target peak learning rate")
    p.add_argument("--draft-lr", type=float, default=3e-3, help="draft peak learning rate")
    p.add_argument("--warmup", type=int, help="warmup steps (both models)")
    p.add_argument("--distill-alpha", type=float, default=0.0,
                   help="draft loss = alpha * next-token CE + (1 - alpha) * KL(target || draft)")
    p.add_argument("--distill-temperature", type=float, default=1.0)
    p.add_argument("--self-distill", type=int,
                   help="also distil the draft on the target's greedy continuations of this many "
                        f"training-set prompts (default {FULL['self_distill']}, quick {QUICK['self_distill']})")
    p.add_argument("--self-distill-new", type=int,
                   help=f"tokens the target writes after each such prompt (default {FULL['self_distill_new']})")
    p.add_argument("--draft-layers", type=int,
                   help=f"the draft's decoder layers (default {FULL['draft_layers']})")
    p.add_argument("--draft-mlp", type=int,
                   help=f"the draft's MLP width (default {FULL['draft_mlp']}; both models' weights must stay "
                        f"under {TOTAL_SIZE_LIMIT / 1e6:.0f} MB)")
    p.add_argument("--evaluate-only", action="store_true",
                   help="evaluate the pair in --out again and rewrite its log's metrics and cards")
    p.add_argument("--draft-only", action="store_true",
                   help="keep --out's demo-target, tokenizer and log; train only a new draft for it")
    p.add_argument("--eval-windows", type=int, help="held-out windows for the final evaluation")
    p.add_argument("--eval-every", type=int, help="held-out check every N steps (0 = off)")
    p.add_argument("--log-every", type=int, help="print progress every N steps")
    p.add_argument("--stdlib", help="stdlib dir to read instead of this interpreter's")
    p.add_argument("--max-files", type=int, help="use only the first N corpus files (debugging)")
    p.add_argument("--pack", metavar="PACKDIR", help="also write PACKDIR/demo.tar.partN + log")
    p.add_argument("--unpack", metavar="PACKDIR", help="only reassemble PACKDIR into --out")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("self_distill_new", "draft_layers", "draft_mlp"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    return args


def pick_device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available")
    return torch.device(name)


def _import_demo_card():
    return _import_sibling("demo_card")


def _load_target(out: Path, device, model: bool = True):
    """--draft-only, --evaluate-only: the tokenizer, the target (if ``model``) and the log already
    in --out."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    target_dir = out / "demo-target"
    if not (target_dir / "config.json").is_file() or not (out / "train_log.json").is_file():
        raise SystemExit(f"--draft-only and --evaluate-only need a trained pair in --out ({out}): "
                         "demo-target/ and train_log.json (copy deepinfer/assets there first)")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval() if model else None
    prior = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
    return Tokenizer.from_file(str(target_dir / "tokenizer.json")), target, prior


def run_training(args: argparse.Namespace) -> dict:
    import tokenizers
    import torch
    import transformers

    demo_card = _import_demo_card()
    demo_distill = _import_sibling("demo_distill")
    t_start = time.perf_counter()
    transformers.utils.logging.disable_progress_bar()
    out = Path(args.out)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    timings = {}

    corpus = demo_data.collect_corpus(args.stdlib, args.max_files)
    log(f"corpus: {corpus.record['num_files']} files from {corpus.root} "
        f"(Python {corpus.record['python_version']}), {corpus.record['num_heldout_files']} held out, "
        f"sha256 {corpus.record['sha256'][:16]}")
    t = time.perf_counter()
    prior = None
    if args.draft_only:
        tokenizer, target, prior = _load_target(out, device)
        if prior["corpus"]["sha256"] != corpus.record["sha256"]:
            log("warning: this stdlib is not the corpus the target trained on (sha256 "
                f"{prior['corpus']['sha256'][:16]}): the draft learns from a different corpus")
    else:
        tokenizer = demo_data.train_tokenizer(corpus.train_texts)
    train_ids, train_starts = demo_data.encode_stream(tokenizer, corpus.train_texts)
    heldout_ids, _ = demo_data.encode_stream(tokenizer, corpus.heldout_texts)
    timings["tokenizer_s"] = time.perf_counter() - t
    log(f"tokenizer: vocab {tokenizer.get_vocab_size()}, {train_ids.numel():,} train / "
        f"{heldout_ids.numel():,} held-out tokens ({timings['tokenizer_s']:.1f}s)")
    if train_ids.numel() <= args.seq_len + 1:
        raise SystemExit("corpus too small for the sequence length")
    spec_prompts = _spec_prompts(tokenizer, corpus)

    data = train_ids.to(device)
    monitor = demo_card.heldout_windows(heldout_ids, 8, args.seq_len)
    eval_fn = lambda m: demo_card.mean_loss(m, monitor, device)

    if not args.draft_only:
        target = build_model(target_config(), args.seed)
    draft = build_model(draft_config(args.draft_layers, args.draft_mlp), args.seed + 1)
    params = {"target": count_params(target), "draft": count_params(draft)}
    log(f"params: target {params['target']:,}, draft {params['draft']:,}")
    bf16_bytes = 2 * (params["target"] + params["draft"])
    if bf16_bytes > TOTAL_SIZE_LIMIT:
        raise SystemExit(f"the two models' weights would take {bf16_bytes / 1e6:.2f} MB in bfloat16, over the "
                         f"{TOTAL_SIZE_LIMIT / 1e6:.0f} MB the pair may take: ask for a smaller draft "
                         f"(--draft-layers {args.draft_layers}, --draft-mlp {args.draft_mlp} now)")

    if args.draft_only:
        target_stats = prior["training"]["target"]
    else:
        target_spec = TrainSpec("target", args.steps, args.batch_size, args.seq_len, args.lr, args.warmup)
        target_stats = train_model(target, data, target_spec, device, args.seed, args.log_every,
                                   eval_fn=eval_fn, eval_every=args.eval_every, doc_starts=train_starts)
    draft_data, draft_starts, self_record = data, train_starts, None
    if args.self_distill:
        t = time.perf_counter()
        stream, starts = demo_distill.self_generated_stream(
            target, train_ids, train_starts, args.self_distill, SELF_DISTILL_PROMPT, args.self_distill_new,
            SELF_DISTILL_BATCH, device, args.seed + 2, demo_data.EOS_ID)
        draft_data = torch.cat([data, stream.to(device)])
        draft_starts = torch.cat([train_starts, starts + train_ids.numel()])
        timings["self_distill_s"] = time.perf_counter() - t
        self_record = {"sequences": args.self_distill, "prompt_tokens": SELF_DISTILL_PROMPT,
                       "new_tokens": args.self_distill_new, "tokens": stream.numel(),
                       "generate_s": timings["self_distill_s"]}
        log(f"self-distillation: {stream.numel():,} tokens of the target's greedy continuations "
            f"({timings['self_distill_s']:.1f}s)")
    draft_spec = TrainSpec("draft", args.draft_steps, args.batch_size, args.seq_len, args.draft_lr,
                           args.warmup, distill_alpha=args.distill_alpha,
                           distill_temperature=args.distill_temperature)
    draft_stats = train_model(draft, draft_data, draft_spec, device, args.seed + 1, args.log_every,
                              teacher=target, eval_fn=eval_fn, eval_every=args.eval_every,
                              doc_starts=draft_starts)
    draft_stats["self_distillation"] = self_record
    del data, draft_data

    saved = {"draft": save_model_dir(draft, tokenizer, out / "demo-draft")}
    saved["target"] = (prior["files"]["target"] if args.draft_only
                       else save_model_dir(target, tokenizer, out / "demo-target"))
    total_bytes = sum(s["weight_bytes"] for s in saved.values())
    log(f"saved: target {saved['target']['weight_bytes']:,} B in {len(saved['target']['safetensors'])} "
        f"file(s), draft {saved['draft']['weight_bytes']:,} B; total {total_bytes:,} B "
        f"({total_bytes / 1e6:.2f} MB, limit {TOTAL_SIZE_LIMIT / 1e6:.0f} MB)")
    assert total_bytes <= TOTAL_SIZE_LIMIT, f"models too large: {total_bytes} bytes"
    del target, draft

    t = time.perf_counter()
    metrics = _evaluate(out, spec_prompts, heldout_ids, args, device)
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    settings = {k: v for k, v in vars(args).items() if k not in ("pack", "unpack")}
    train_log = {
        "settings": settings,
        "device": device_name,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "corpus": corpus.record,
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tokenizer.get_vocab_size(),
                      "special_tokens": demo_data.SPECIAL_TOKENS, "train_tokens": train_ids.numel(),
                      "heldout_tokens": heldout_ids.numel()},
        "params": params,
        "files": saved,
        "total_weight_bytes": total_bytes,
        "training": {"target": target_stats, "draft": draft_stats},
        "metrics": metrics,
        "timings_s": timings,
    }
    if prior is not None:  # the target's run, kept as it was
        train_log["target_run"] = {key: prior.get("target_run", {}).get(key, prior[key])
                                   for key in ("settings", "device", "versions", "timings_s")}
    _write_log_and_cards(out, train_log)
    return train_log


def _spec_prompts(tokenizer, corpus):
    """The replay's held-out prompts (taken before any training: too few files fail early)."""
    import torch

    rows = demo_data.heldout_prompt_ids(corpus.heldout_texts, SPEC_PROMPTS, SPEC_PROMPT_LEN,
                                        lambda text: tokenizer.encode(text, add_special_tokens=False).ids)
    if not rows:
        raise SystemExit(f"no held-out file gives a prompt of {SPEC_PROMPT_LEN} tokens (see --max-files)")
    return torch.tensor(rows, dtype=torch.long)


def _evaluate(out: Path, spec_prompts, heldout_ids, args, device) -> dict:
    demo_distill = _import_sibling("demo_distill")
    return _import_demo_card().evaluate_pair(
        out / "demo-target", out / "demo-draft", heldout_ids, args.eval_windows, args.seq_len, device,
        spec=lambda t, d: demo_distill.speculative_acceptance(t, d, spec_prompts, SPEC_NEW_TOKENS, SPEC_K,
                                                              device))


def _write_log_and_cards(out: Path, train_log: dict) -> None:
    demo_card = _import_demo_card()
    demo_data.write_json(out / "train_log.json", train_log)
    for role in ("target", "draft"):
        (out / f"demo-{role}" / "README.md").write_text(
            demo_card.model_card(role, train_log), encoding="utf-8")
    log(demo_card.summary(train_log))


def reevaluate(args: argparse.Namespace) -> dict:
    """--evaluate-only: the pair in --out evaluated again (after the evaluation changed), its log's
    metrics and both cards rewritten; the weights are not touched."""
    import torch

    out, device = Path(args.out), pick_device(args.device)
    tokenizer, _, train_log = _load_target(out, device, model=False)
    for key in ("eval_windows", "seq_len"):  # evaluated as the log's run was
        setattr(args, key, train_log["settings"][key])
    corpus = demo_data.collect_corpus(args.stdlib, args.max_files)
    if corpus.record["sha256"] != train_log["corpus"]["sha256"]:
        raise SystemExit("--evaluate-only: this stdlib is not the corpus of the log (sha256 "
                         f"{train_log['corpus']['sha256'][:16]}): its held-out files would differ")
    heldout_ids, _ = demo_data.encode_stream(tokenizer, corpus.heldout_texts)
    t = time.perf_counter()
    train_log["metrics"] = _evaluate(out, _spec_prompts(tokenizer, corpus), heldout_ids, args, device)
    train_log["timings_s"]["eval_s"] = time.perf_counter() - t
    train_log["evaluation_device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    _write_log_and_cards(out, train_log)
    return train_log


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.unpack:
        _import_sibling("demo_pack").unpack(args.unpack, args.out, MODEL_DIRS)
        return 0
    if args.evaluate_only:
        reevaluate(args)
    else:
        run_training(args)
    if args.pack:
        _import_sibling("demo_pack").pack(Path(args.out), Path(args.pack), MODEL_DIRS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
