"""`deepinfer serve | generate | plugins list | bench | train-demo`."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from deepinfer.cli_errors import DEBUG_ENV, EXIT_INTERRUPTED, report
from deepinfer.core.config import EngineConfig, parse_plugin_options


def _plugin_options(text: str) -> dict[str, dict[str, Any]]:
    try:
        return parse_plugin_options(text)
    except ValueError as e:  # (argparse reports an ArgumentTypeError's own message)
        raise argparse.ArgumentTypeError(str(e).removeprefix("--plugin-options ")) from None


def add_engine_args(p: argparse.ArgumentParser, model_positional: bool = True) -> None:
    """Flags shared by every command that builds an engine (each maps to an EngineConfig field)."""
    if model_positional:
        p.add_argument("model", nargs="?", default=None,
                       help="model directory or Hugging Face Hub id, org/name (default: the demo model)")
    p.add_argument("--revision", default=None, help="a Hub model's branch, tag or commit (default: main)")
    p.add_argument("--config", dest="config_file", default=None, help="YAML, TOML or JSON config file")
    p.add_argument("--plugins", default=None, help="comma-separated plugin names, e.g. prefix-cache")
    p.add_argument("--plugin-options", default=None, type=_plugin_options,
                   help='JSON object of per-plugin options, e.g. \'{"fcfs": {...}}\'')
    p.add_argument("--device", default=None, help="device plugin name or auto")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--kv-cache-memory-gb", type=float, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quantization", default=None, choices=["fp8"],
                   help="fp8: linear weights in 128x128 FP8 blocks through the device's FP8 GEMM (DeepSeek-V2/V3)")
    p.add_argument("--enforce-eager", action="store_const", const=True, default=None,
                   help="never capture device graphs (CUDA graphs)")
    p.add_argument("--cuda-graph-sizes", default=None, help="decode batch sizes to capture, e.g. 1,2,4,8")
    p.add_argument("--cuda-graph-prefill-sizes", default=None,
                   help="token counts of one-sequence prefill steps to capture, e.g. 64,128,256 (none: off)")
    p.add_argument("--max-seq-len-to-capture", type=int, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="ranks (processes, one device each) to split the model over; spawned on this host, or "
                        "joined through env:// under a launcher that sets WORLD_SIZE (torchrun)")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=None,
                   help="ranks that each run their own requests through attention (data-parallel attention); "
                        "every rank a whole replica, or with --enable-expert-parallel the experts sharded")
    p.add_argument("--enable-expert-parallel", action="store_const", const=True, default=None,
                   help="shard a mixture-of-experts model's routed experts over the ranks (with "
                        "--data-parallel-size N, tensor-parallel size 1)")
    p.add_argument("--batch-invariant", action="store_const", const=True, default=None,
                   help="the same bits for a request whatever it is batched with (slower; see docs/batch-invariance.md)")
    p.add_argument("--num-redundant-experts", type=int, default=None,
                   help="expert slots a MoE layer has beyond its experts (expert parallelism; placed by eplb)")


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = set(EngineConfig.model_fields) - {"plugins"}
    out = {k: v for k, v in vars(args).items() if k in keys and v is not None}
    if getattr(args, "plugins", None):
        out["plugins"] = [p.strip() for p in args.plugins.split(",") if p.strip()]
    return out


def cmd_plugins(args: argparse.Namespace) -> int:
    from deepinfer.plugins.status import format_table, plugin_statuses

    rows = plugin_statuses()
    if args.json:
        print(json.dumps([{"name": r.name, "slot": r.slot, "distribution": r.distribution,
                           "status": r.status} for r in rows], indent=2))
    else:
        print(format_table(rows))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from deepinfer.core.sampling_params import SamplingParams
    from deepinfer.llm import LLM

    # (the sampling parameters checked before the engine is built: a bad one fails at once)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, top_p=args.top_p,
                            seed=args.sampling_seed, ignore_eos=args.ignore_eos)
    ov = engine_overrides(args)
    ov.pop("model", None)
    llm = LLM(args.model, config_file=args.config_file, progress=False, **ov)
    prompts = args.prompt or [sys.stdin.read()]
    for out in llm.generate(prompts, params, use_tqdm=False):
        c = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": c.text, "token_ids": c.token_ids,
                              "finish_reason": c.finish_reason}))
        else:
            print(c.text)
    if args.metrics:  # (the engine's counters and gauges, plugins' own included)
        metrics = dict(sorted(llm.get_metrics().items()))
        if args.json:
            print(json.dumps({"metrics": metrics}))
        else:
            print("# metrics")
            for name, value in metrics.items():
                print(f"{name} {value:g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description=__doc__)
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of an error (also {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="inspect plugins")
    psub = p.add_subparsers(dest="plugins_command", required=True)
    pl = psub.add_parser("list", help="every discovered plugin and whether it can load here")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plugins)

    g = sub.add_parser("generate", help="generate text offline")
    add_engine_args(g)
    g.add_argument("--prompt", action="append", help="a prompt (repeatable; default: stdin)")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--sampling-seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt")
    g.add_argument("--metrics", action="store_true",
                   help="then print the engine's metrics (plugins' too): 'name value' lines after '# metrics', "
                        "or with --json one more object, {\"metrics\": {...}}")
    g.set_defaults(func=cmd_generate)

    from deepinfer.bench.command import add_bench_parser
    from deepinfer.router.command import add_router_parser
    from deepinfer.serve.command import add_serve_parser
    from deepinfer.tools.command import add_train_parser

    add_serve_parser(sub, add_engine_args, engine_overrides)
    serve = sub.choices["serve"]
    serve.set_defaults(func=_checked_first(serve.get_default("func")))
    add_bench_parser(sub, add_engine_args, engine_overrides)
    add_router_parser(sub)
    add_train_parser(sub)
    _add_debug_everywhere(sub)
    return parser


def _add_debug_everywhere(sub: argparse._SubParsersAction) -> None:
    """``--debug`` after the command too (``deepinfer generate ... --debug``)."""
    for name, p in sub.choices.items():
        if name == "train-demo":  # (it parses its own options)
            continue
        if "--debug" not in p._option_string_actions:
            p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_debug_everywhere(action)


def _checked_first(run):
    """``serve`` checks the config, the plugin selection and the model directory in this process
    first: a mistake there is the user's (exit 2, as for ``generate``), not an engine that failed."""
    def checked(args: argparse.Namespace) -> int:
        from deepinfer.builder import model_path_of
        from deepinfer.core.config import build_config
        from deepinfer.core.model_config import read_model_config
        from deepinfer.plugins.selection import select

        config = build_config(args.config_file, engine_overrides(args))
        select(config)
        read_model_config(model_path_of(config))
        return run(args)

    return checked


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train-demo"]:  # its own parser takes every option after the command
        from deepinfer.tools.train_demo import main as train_demo

        return train_demo(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "bench" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # (each row as it is known, into a pipe or file too)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 (every error reaches the user as a sentence and an exit code)
        return report(e, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
