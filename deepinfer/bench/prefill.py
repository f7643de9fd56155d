"""`deepinfer bench prefill`: B prompts of L tokens in one go; tokens/s and model FLOP utilisation."""
from __future__ import annotations

import statistics
import time

from deepinfer.bench import workloads
from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.core.sampling_params import SamplingParams


def add_prefill_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("prefill", help="prefill throughput and model FLOP utilisation")
    add_engine_args(b)
    b.add_argument("--random-model", default=None, help="build a random model of this shape instead")
    b.add_argument("--batch", type=int, default=4)
    b.add_argument("--input-len", type=int, default=4096)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--plot", default=None, metavar="PNG", help="write a bar chart of the rate to this file")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_prefill(a, _ov(a)))


def run_prefill(args, overrides: dict) -> int:
    from deepinfer.bench.ceilings import measure_before_run
    from deepinfer.bench.models import bench_model
    from deepinfer.bench.roofline import bound_seconds, describe
    from deepinfer.llm import LLM

    if args.plot:
        from deepinfer.bench.plot import require_matplotlib

        require_matplotlib()  # before any work
    model, overrides = bench_model(args, overrides, "bfloat16")
    overrides.setdefault("max_num_batched_tokens", args.batch * args.input_len)
    measure_before_run(overrides)
    llm = LLM(model, config_file=args.config_file, progress=False, **overrides)
    wl = workloads.fixed(args.batch, args.input_len, 1, llm.engine.ctx.model_config["vocab_size"])
    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    secs = []
    for _ in range(args.repeats):
        llm.engine.ctx.device.synchronize()
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        llm.engine.ctx.device.synchronize()
        secs.append(time.perf_counter() - t)
        progress(f"prefill run {len(secs)}/{args.repeats}: {secs[-1]:.3f} s")
    s = statistics.median(secs)
    print(f"deepinfer bench prefill: {args.batch} x {args.input_len} tokens, median of {args.repeats}: "
          f"{s * 1e3:.1f} ms, {wl.num_prompt_tokens / s:,.0f} tok/s")
    print(describe(llm.engine, wl, s, "prefill"), flush=True)
    write_json(args, [{"name": "deepinfer", "seconds": secs, "median_s": s, "prompt_tokens": wl.num_prompt_tokens,
                       "prompt_tok_s": wl.num_prompt_tokens / s}])
    if args.plot:
        from deepinfer.bench.plot import write_chart

        bound = bound_seconds(llm.engine, wl, "prefill")
        write_chart(args.plot, f"deepinfer bench prefill: {args.batch} x {args.input_len} tokens",
                    [("deepinfer", wl.num_prompt_tokens / s)], "prompt tokens/s",
                    wl.num_prompt_tokens / bound if bound else None)
        print(f"chart written to {args.plot}")
    return 0
