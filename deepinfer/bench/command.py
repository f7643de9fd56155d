"""`deepinfer bench latency | throughput` (and `serve`, from deepinfer.bench.serve)."""
from __future__ import annotations

import argparse
import platform

from deepinfer.bench import workloads
from deepinfer.bench.output import add_json_arg, write_json
from deepinfer.bench.runners import (
    RunResult,
    gpu_idle,
    load_hf,
    run_deepinfer,
    run_hf_generate,
    run_hf_generate_batch,
)


def add_bench_parser(sub, add_engine_args, engine_overrides) -> None:
    p = sub.add_parser("bench", help="measure speed on the standard workloads")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    for name, helptext in (("latency", "a fixed batch: B prompts of --input-len, --output-len new tokens"),
                           ("throughput", "the nano-vllm workload: lengths uniform in [--min-len, --max-len]")):
        b = bsub.add_parser(name, help=helptext)
        add_engine_args(b)
        b.add_argument("--random-model", default=None,
                       help="build a random model of this shape instead (llama-tiny, llama-1b, qwen3-0.6b, qwen3-tiny)")
        b.add_argument("--peer", choices=["hf"], default=None, help="run transformers on the same requests too")
        b.add_argument("--repeats", type=int, default=3)
        add_json_arg(b)
        b.add_argument("--plot", default=None, metavar="PNG", help="write a bar chart of the rates to this file")
        b.add_argument("--gpu-idle", action="store_true",
                       help="one more run timing every step with device events: the share of the decode "
                            "phase when the device was idle")
        if name == "latency":
            b.add_argument("--batch", type=int, default=1)
            b.add_argument("--input-len", type=int, default=512)
            b.add_argument("--output-len", type=int, default=256)
        else:
            b.add_argument("--num-requests", type=int, default=256)
            b.add_argument("--min-len", type=int, default=100)
            b.add_argument("--max-len", type=int, default=1024)
            b.add_argument("--peer-requests", type=int, default=None,
                           help="run the peer on only the first N requests (its rate is compared)")
        b.add_argument("--peer-repeats", type=int, default=None, help="timed runs of the peer (default: --repeats)")
        b.set_defaults(func=lambda a, _ov=engine_overrides: run_bench(a, _ov(a)))
    from deepinfer.bench.disagg import add_disagg_parser
    from deepinfer.bench.kvstore import add_kvstore_parser
    from deepinfer.bench.prefill import add_prefill_parser
    from deepinfer.bench.prefix import add_prefix_parser
    from deepinfer.bench.router import add_router_bench_parser
    from deepinfer.bench.spec import add_spec_parser
    from deepinfer.bench.structured import add_structured_parser
    from deepinfer.bench.swa import add_swa_parser

    add_prefill_parser(bsub, add_engine_args, engine_overrides)
    add_prefix_parser(bsub, add_engine_args, engine_overrides)
    add_kvstore_parser(bsub, add_engine_args, engine_overrides)
    add_disagg_parser(bsub, add_engine_args, engine_overrides)
    add_spec_parser(bsub, add_engine_args, engine_overrides)
    add_swa_parser(bsub, add_engine_args, engine_overrides)
    add_structured_parser(bsub, add_engine_args, engine_overrides)
    add_router_bench_parser(bsub)
    try:
        from deepinfer.bench.serve import add_bench_serve_parser
    except ImportError:
        return
    add_bench_serve_parser(bsub)


def run_bench(args: argparse.Namespace, overrides: dict) -> int:
    from deepinfer.bench.ceilings import measure_before_run
    from deepinfer.bench.models import bench_model
    from deepinfer.llm import LLM

    if args.plot:
        from deepinfer.bench.plot import require_matplotlib

        require_matplotlib()  # before any work
    if args.peer == "hf":
        from deepinfer.bench.models import require_transformers

        require_transformers()
    model, overrides = bench_model(args, overrides, "float32")
    measure_before_run(overrides)
    llm = LLM(model, config_file=args.config_file, progress=False, **overrides)
    vocab = llm.engine.ctx.model_config["vocab_size"]
    if args.bench_command == "latency":
        wl = workloads.fixed(args.batch, args.input_len, args.output_len, vocab)
    else:
        wl = workloads.uniform(args.num_requests, args.min_len, args.max_len, vocab)
    ours = run_deepinfer(llm, wl, args.repeats)
    from deepinfer.bench.roofline import bound_seconds, describe

    roof = describe(llm.engine, wl, ours.median_s, "decode")
    bound = bound_seconds(llm.engine, wl, "decode")
    if args.gpu_idle:
        ours.extra.update(gpu_idle(llm, wl))
    results = [ours]
    print_head(args, wl)
    print_row(ours)  # printed now: the peer may take long
    print(roof, flush=True)
    if args.bench_command == "latency" and "ttft_ms_median" in ours.extra:
        ttft = ours.extra["ttft_ms_median"] / 1000
        after = (ours.output_tokens - len(wl.prompts)) / max(ours.seconds[-1] - ttft, 1e-9)
        print(f"first token after {1000 * ttft:.1f} ms (median over the requests of the last run); "
              f"{after:,.1f} output tok/s after it", flush=True)
    if args.peer == "hf":
        del llm
        hf = load_hf(model or llm_model_path(), _device_type(overrides), _hf_dtype(overrides))
        reps = args.peer_repeats or args.repeats
        if args.bench_command == "latency":
            peer = run_hf_generate(hf, wl, reps)
        else:
            n = args.peer_requests or len(wl.prompts)
            peer = run_hf_generate_batch(hf, wl.head(n), reps)
            if n < len(wl.prompts):
                peer.name += f" ({n} requests)"
        results.append(peer)
        print_row(peer)
        print(f"ratio deepinfer / peer (output tok/s): {ours.output_tok_s / peer.output_tok_s:.2f}x")
    write_json(args, [{"name": r.name, "seconds": r.seconds, "output_tokens": r.output_tokens,
                       "prompt_tokens": r.prompt_tokens, "output_tok_s": r.output_tok_s, **r.extra}
                      for r in results])
    if args.gpu_idle:
        x = ours.extra
        print(f"device idle: {100 * x['gpu_idle_fraction']:.2f}% of the decode phase ({x['decode_steps']} steps, "
              f"{x['decode_phase_ms']:.1f} ms)")
    if args.plot:
        from deepinfer.bench.plot import write_chart

        write_chart(args.plot, f"deepinfer bench {args.bench_command}: {len(wl.prompts)} requests",
                    [(r.name, r.output_tok_s) for r in results], "output tokens/s",
                    sum(wl.output_lens) / bound if bound else None)
        print(f"chart written to {args.plot}")
    return 0


def llm_model_path() -> str:
    from deepinfer import DEMO_MODEL

    return DEMO_MODEL


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _device_type(overrides: dict) -> str:
    dev = overrides.get("device", "auto")
    return "cpu" if dev == "cpu" or not _cuda() else "cuda"


def _hf_dtype(overrides: dict) -> str:
    return overrides.get("dtype", "auto")


def print_head(args: argparse.Namespace, wl: workloads.Workload) -> None:
    import torch

    print(f"deepinfer bench {args.bench_command}: {len(wl.prompts)} requests, "
          f"{wl.num_prompt_tokens} prompt + {wl.num_output_tokens} output tokens; "
          f"median of {args.repeats}; torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'engine':<32}{'seconds':>10}{'output tok/s':>15}{'total tok/s':>14}")


def print_row(r: RunResult) -> None:
    print(f"{r.name:<32}{r.median_s:>10.3f}{r.output_tok_s:>15.1f}{r.total_tok_s:>14.1f}", flush=True)
