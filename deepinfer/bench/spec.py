"""`deepinfer bench spec`: decoding with each drafter against none, at batch 1 and a larger batch."""
from __future__ import annotations

import statistics
import time

from deepinfer.core.sampling_params import SamplingParams

DRAFTERS = ("none", "draft-model", "deepspark", "ngram")


def add_spec_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("spec", help="speculative decoding: each drafter against none")
    add_engine_args(b)
    b.add_argument("--drafters", default=",".join(DRAFTERS))
    b.add_argument("--batch", default="1,64", help="comma-separated batch sizes")
    b.add_argument("--input-len", type=int, default=64, help="prompt tokens (from held-out stdlib files)")
    b.add_argument("--output-len", type=int, default=128)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--prompts", type=int, default=8,
                   help="distinct prompts a run decodes, in batches of --batch one after another "
                        "(at least one batch): at batch 1 the figures are not one prompt's")
    b.add_argument("--isolate", action="store_true",
                   help="run each drafter in a fresh process (no state left over from the ones before)")
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_spec(a, _ov(a)))


def stdlib_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens from standard-library files the demo models did not train on."""
    from deepinfer.tools.demo_data import collect_corpus, heldout_prompt_ids

    prompts = heldout_prompt_ids(collect_corpus().heldout_texts, n, length,
                                 lambda text: tokenizer.encode(text, add_special_tokens=False))
    if len(prompts) < n:
        raise ValueError(f"this interpreter's held-out standard-library files give {len(prompts)} prompts of "
                         f"{length} tokens, fewer than the {n} asked for: ask for fewer or shorter prompts")
    return prompts


def run_spec(args, overrides: dict) -> int:
    overrides = dict(overrides)
    model = overrides.pop("model", None)
    base_plugins = [p for p in (overrides.pop("plugins", None) or []) if p not in DRAFTERS]
    work = {"model": model, "config_file": args.config_file, "overrides": overrides,
            "batches": [int(b) for b in args.batch.split(",")], "prompts": args.prompts,
            "input_len": args.input_len, "output_len": args.output_len, "repeats": args.repeats}
    rows = []
    for drafter in args.drafters.split(","):
        plugins = base_plugins + ([] if drafter == "none" else [drafter])
        if args.isolate:  # a fresh interpreter: nothing left over from the drafters run before
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                rows += pool.submit(drafter_rows, drafter, plugins, work).result()
        else:
            rows += drafter_rows(drafter, plugins, work)
            from deepinfer.bench.prefix import _release_memory

            _release_memory()
    report(args, rows)
    return 0


def drafter_rows(drafter: str, plugins: list[str], work: dict) -> list[dict]:
    """One drafter's rows: each batch size decoded ``repeats`` times (medians), with its metrics."""
    from deepinfer.llm import LLM

    llm = LLM(work["model"], config_file=work["config_file"], progress=False, plugins=plugins, **work["overrides"])
    rows = []
    for batch in work["batches"]:
        groups = max(1, -(-work["prompts"] // batch))
        prompts = stdlib_prompts(llm.get_tokenizer(), groups * batch, work["input_len"])
        params = SamplingParams(temperature=0, max_tokens=work["output_len"], ignore_eos=True)
        llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
        m0, secs = llm.get_metrics(), []
        for _ in range(work["repeats"]):
            t = time.perf_counter()
            for g in range(groups):
                llm.generate([{"prompt_token_ids": p} for p in prompts[g * batch:(g + 1) * batch]], params,
                             use_tqdm=False)
            secs.append(time.perf_counter() - t)
        m = {k: v - m0.get(k, 0) for k, v in llm.get_metrics().items()}
        drafts = m.get("deepinfer:spec_decode_num_drafts", 0)
        rows.append({
            "drafter": drafter, "batch": batch, "seconds": statistics.median(secs),
            "tok_s": groups * batch * work["output_len"] / statistics.median(secs),
            "tokens_per_step": m["deepinfer:generation_tokens"] / m["deepinfer:request_sampling_steps"],
            "verified_per_draft": m.get("deepinfer:spec_decode_num_verified_tokens", 0) / drafts if drafts else 0,
            "accepted_per_draft": m.get("deepinfer:spec_decode_num_accepted_tokens", 0) / drafts if drafts else 0,
        })
    return rows


def report(args, rows: list[dict]) -> None:
    print(f"deepinfer bench spec: greedy, {args.input_len}-token prompts, {args.output_len} new tokens, "
          f"at least {args.prompts} prompts a run (batches one after another), median of {args.repeats} runs")
    print(f"{'drafter':<13}{'batch':>6}{'seconds':>9}{'tok/s':>9}{'vs none':>9}{'tok/step':>10}"
          f"{'verified':>10}{'accepted':>10}")
    base = {r["batch"]: r["tok_s"] for r in rows if r["drafter"] == "none"}
    for r in rows:
        ratio = f"{r['tok_s'] / base[r['batch']]:.2f}x" if r["batch"] in base else "-"
        print(f"{r['drafter']:<13}{r['batch']:>6}{r['seconds']:>9.2f}{r['tok_s']:>9.1f}{ratio:>9}"
              f"{r['tokens_per_step']:>10.2f}{r['verified_per_draft']:>10.2f}{r['accepted_per_draft']:>10.2f}")
