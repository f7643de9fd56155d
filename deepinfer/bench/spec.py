"""`deepinfer bench spec`: decoding with each drafter against none, at batch 1 and a larger batch."""
from __future__ import annotations

import statistics
import time

from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.core.sampling_params import SamplingParams

DRAFTERS = ("none", "draft-model", "deepspark", "ngram")
#: prompts a run decodes by default: batch 1 decodes the same ones as a batch of 64. Among the demo
#: pair's first eight prompts, drafts accepted a round ranged from 0.7 to 4.1 (docs/benchmarks.md,
#: session 54), so eight gave a figure of a few files
DEFAULT_PROMPTS = 64


def add_spec_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("spec", help="speculative decoding: each drafter against none")
    add_engine_args(b)
    b.add_argument("--drafters", default=",".join(DRAFTERS),
                   help="comma-separated; --plugin-options given for a drafter apply to its runs only")
    b.add_argument("--batch", default="1,64", help="comma-separated batch sizes")
    b.add_argument("--input-len", type=int, default=64, help="prompt tokens (from held-out stdlib files)")
    b.add_argument("--output-len", type=int, default=128)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (the default); above 0: sampled, each prompt with a seed of its own (its "
                        "index), so that every drafter and every run draws from the same seeds")
    b.add_argument("--stdlib", metavar="DIR",
                   help="take the prompts from the held-out files of this standard-library directory (default: "
                        "this interpreter's; another Python version's files give other prompts: the demo pair "
                        "trained on Python 3.12's, see its card)")
    b.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS,
                   help="prompts a run decodes, in batches of --batch one after another (at least one "
                        f"batch; default {DEFAULT_PROMPTS}: every batch size up to it decodes the same prompts, "
                        "and batch 1's figures are not a few files': prompts differ widely in the drafts they "
                        "get accepted)")
    b.add_argument("--isolate", action="store_true",
                   help="run each drafter in a fresh process, one after another (no state left over from the "
                        "ones before); by default all are built in this process and take turns run by run, "
                        "each with a KV pool of 2 GiB on a GPU unless --kv-cache-memory-gb (or the config) "
                        "sets another: give more for large models or long --max-model-len")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_spec(a, _ov(a)))


def check_stdlib(stdlib: str | None) -> None:
    from pathlib import Path

    if stdlib is not None and not Path(stdlib).is_dir():
        raise ValueError(f"--stdlib {stdlib!r} is not a directory: give a Python standard library's directory "
                         "(such as /usr/lib/python3.12), or leave it out for this interpreter's")


def stdlib_prompts(tokenizer, n: int, length: int, stdlib: str | None = None) -> list[list[int]]:
    """n prompts of `length` tokens from standard-library files the demo models did not train on:
    the held-out files of `stdlib` (a directory; by default this interpreter's)."""
    from deepinfer.tools.demo_data import collect_corpus, heldout_prompt_ids

    check_stdlib(stdlib)
    prompts = heldout_prompt_ids(collect_corpus(stdlib).heldout_texts, n, length,
                                 lambda text: tokenizer.encode(text, add_special_tokens=False))
    if len(prompts) < n:
        where = f"{stdlib}'s" if stdlib else "this interpreter's"
        raise ValueError(f"{where} held-out standard-library files give {len(prompts)} prompts of "
                         f"{length} tokens, fewer than the {n} asked for: ask for fewer or shorter prompts")
    return prompts


#: each drafter's KV pool when all are built in one process on an accelerator and no KV size is
#: given (by flag, config file or environment): each engine would otherwise size its pool from the
#: memory the ones before it left (on the CPU each takes a small share of what is free anyway)
INTERLEAVED_KV_GB = 2.0


def run_spec(args, overrides: dict) -> int:
    overrides = dict(overrides)
    model = overrides.pop("model", None)
    base_plugins = [p for p in (overrides.pop("plugins", None) or []) if p not in DRAFTERS]
    work = {"model": model, "config_file": args.config_file, "overrides": overrides,
            "batches": [int(b) for b in args.batch.split(",")], "prompts": args.prompts,
            "input_len": args.input_len, "output_len": args.output_len, "repeats": args.repeats,
            "temperature": args.temperature, "stdlib": args.stdlib}
    if not 0 <= args.temperature <= 100:
        raise ValueError(f"--temperature must be 0 (greedy) or positive up to 100, got {args.temperature}")
    check_stdlib(args.stdlib)
    names = args.drafters.split(",")
    twice = next((d for i, d in enumerate(names) if d in names[:i]), None)
    if twice is not None:
        raise ValueError(f"--drafters names {twice!r} twice; give each drafter once ({', '.join(DRAFTERS)})")
    drafters = {d: base_plugins + ([] if d == "none" else [d]) for d in names}
    if not args.isolate:
        report(args, interleaved_rows(drafters, work))
        return 0
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rows = []
    for drafter, plugins in drafters.items():  # a fresh interpreter: nothing left from the ones before
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows += pool.submit(drafter_rows, drafter, plugins, work).result()
    report(args, rows)
    return 0


def _engine(plugins: list[str], work: dict):
    """An engine with ``plugins``; --plugin-options given for a drafter go to the runs that select it."""
    from deepinfer.llm import LLM

    overrides = dict(work["overrides"])
    if overrides.get("plugin_options"):
        overrides["plugin_options"] = {name: opts for name, opts in overrides["plugin_options"].items()
                                       if name not in DRAFTERS or name in plugins}
    return LLM(work["model"], config_file=work["config_file"], progress=False, plugins=plugins, **overrides)


class Workload:
    """One batch size's runs: ``prompts`` distinct prompts (at least one batch), decoded in batches
    one after another."""

    def __init__(self, llm, batch: int, work: dict) -> None:
        self.batch, self.groups = batch, max(1, -(-work["prompts"] // batch))
        self.tokens = self.groups * batch * work["output_len"]
        self.prompts = stdlib_prompts(llm.get_tokenizer(), self.groups * batch, work["input_len"], work.get("stdlib"))
        temp = work.get("temperature", 0.0)
        self.params = [SamplingParams(temperature=temp, seed=i if temp > 0 else None, max_tokens=work["output_len"],
                                      ignore_eos=True) for i in range(len(self.prompts))]

    def warm_up(self, llm) -> dict:
        """A short request (compiles what a first run would), then the metrics to count from."""
        llm.generate({"prompt_token_ids": self.prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
        return llm.get_metrics()

    def run(self, llm) -> float:
        t = time.perf_counter()
        for g in range(self.groups):
            part = slice(g * self.batch, (g + 1) * self.batch)
            llm.generate([{"prompt_token_ids": p} for p in self.prompts[part]], self.params[part], use_tqdm=False)
        return time.perf_counter() - t

    def row(self, drafter: str, secs: list[float], m0: dict, m1: dict) -> dict:
        m = {k: v - m0.get(k, 0) for k, v in m1.items()}
        drafts = m.get("deepinfer:spec_decode_num_drafts", 0)
        return {
            "drafter": drafter, "batch": self.batch, "seconds": statistics.median(secs),
            "tok_s": self.tokens / statistics.median(secs),
            "tokens_per_step": m["deepinfer:generation_tokens"] / m["deepinfer:request_sampling_steps"],
            "verified_per_draft": m.get("deepinfer:spec_decode_num_verified_tokens", 0) / drafts if drafts else 0,
            "accepted_per_draft": m.get("deepinfer:spec_decode_num_accepted_tokens", 0) / drafts if drafts else 0,
        }


def drafter_rows(drafter: str, plugins: list[str], work: dict) -> list[dict]:
    """One drafter's rows (``--isolate``): each batch size decoded ``repeats`` times (medians)."""
    llm = _engine(plugins, work)
    rows = []
    for batch in work["batches"]:
        wl = Workload(llm, batch, work)
        m0 = wl.warm_up(llm)
        secs = [wl.run(llm) for _ in range(work["repeats"])]
        rows.append(wl.row(drafter, secs, m0, llm.get_metrics()))
        progress(f"spec {drafter} batch {batch}: runs of {', '.join(f'{s:.2f}' for s in secs)} s")
    return rows


def take_turns(engines: dict, run, repeats: int) -> dict[str, list[float]]:
    """``run(engine)``'s seconds for each engine over ``repeats`` rounds in which every engine runs
    once, the order alternating round by round (so that none always runs first)."""
    secs: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(repeats):
        for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
            secs[name].append(run(engines[name]))
    return secs


def interleaved_rows(drafters: dict[str, list[str]], work: dict) -> list[dict]:
    """Every drafter's engine in this process; at each batch size the drafters take turns, run by
    run, in alternating order, so that a host whose speed drifts slows them alike (one after
    another, a drift between drafters lands in their ratio)."""
    import torch

    from deepinfer.core.config import build_config

    given = build_config(work["config_file"], work["overrides"])
    on_cpu = given.device == "cpu" or (given.device == "auto" and not torch.cuda.is_available())
    if given.kv_cache_memory_gb is None and not on_cpu:
        work = {**work, "overrides": {**work["overrides"], "kv_cache_memory_gb": INTERLEAVED_KV_GB}}
    llms = {d: _engine(plugins, work) for d, plugins in drafters.items()}
    found: dict[tuple[str, int], dict] = {}
    for batch in work["batches"]:
        wl = Workload(next(iter(llms.values())), batch, work)
        m0 = {d: wl.warm_up(llm) for d, llm in llms.items()}
        secs = take_turns(llms, _reporting(wl, batch), work["repeats"])
        for d, llm in llms.items():
            found[d, batch] = wl.row(d, secs[d], m0[d], llm.get_metrics())
    return [found[d, b] for d in llms for b in work["batches"]]


def _reporting(wl: Workload, batch: int):
    """``wl.run`` that says each run's time on stderr as it ends."""
    def run(llm) -> float:
        s = wl.run(llm)
        name = next((p for p in llm.engine.plugin_names.get("drafter", [])), "none")
        progress(f"spec {name} batch {batch}: {s:.2f} s")
        return s

    return run


def report(args, rows: list[dict]) -> None:
    kind = "greedy" if args.temperature == 0 else f"sampled at temperature {args.temperature:g} (seeded)"
    print(f"deepinfer bench spec: {kind}, {args.input_len}-token prompts, {args.output_len} new tokens, "
          f"at least {args.prompts} prompts a run (batches one after another), median of {args.repeats} runs"
          + (" (each drafter in its own process)" if args.isolate else " (the drafters in turn, run by run)"))
    print(f"{'drafter':<13}{'batch':>6}{'seconds':>9}{'tok/s':>9}{'vs none':>9}{'tok/step':>10}"
          f"{'verified':>10}{'accepted':>10}")
    base = {r["batch"]: r["tok_s"] for r in rows if r["drafter"] == "none"}
    for r in rows:
        ratio = f"{r['tok_s'] / base[r['batch']]:.2f}x" if r["batch"] in base else "-"
        print(f"{r['drafter']:<13}{r['batch']:>6}{r['seconds']:>9.2f}{r['tok_s']:>9.1f}{ratio:>9}"
              f"{r['tokens_per_step']:>10.2f}{r['verified_per_draft']:>10.2f}{r['accepted_per_draft']:>10.2f}")
    write_json(args, rows)
