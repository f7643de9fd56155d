"""`deepinfer bench kvstore`: the `kv-store` tiers' restore time per token against recomputing it (issue 72).

For each prompt length, the time to the first token of a fresh prompt (``max_tokens=1``) in three
engines, in process, one after another:

- **recompute**: `no-cache`, the whole prompt prefilled;
- **host**: `kv-store` with a device pool of one longest prompt and a block: the prompt is computed
  (its blocks written through to the host tier and the directory), a filler prompt that takes every
  block of the pool then evicts it from the device, and the timed request restores it from host memory;
- **disk**: `kv-store` started again on the same directory (a restart: its host tier is empty), the
  block files dropped from the page cache (``posix_fadvise``) unless ``--warm-page-cache``, so the
  timed request waits for its prefetch from the directory, then restores from host memory.

A restored request still computes its last partial block and last token, as a served one does. The
store's own counters give the blocks hit and bytes read in each tier; the table prints time per prompt
token and the shortest length from which loading beats prefill (the store pays only there).
"""
from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from typing import Any

from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.core.sampling_params import SamplingParams

ONE = SamplingParams(temperature=0, max_tokens=1)
TIERS = ("recompute", "host", "disk")


def add_kvstore_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("kvstore", help="kv-store restore time per token (host, directory) against prefill",
                        description=__doc__)
    add_engine_args(b)
    b.add_argument("--random-model", default=None, help="build a random model of this shape instead (llama-1b, ...)")
    b.add_argument("--lengths", default="512,1024,2048,4096,8192", help="prompt lengths, comma-separated")
    b.add_argument("--repeats", type=int, default=3, help="fresh prompts a length and tier (the median is printed)")
    b.add_argument("--dir", default=None, metavar="PATH",
                   help="the directory tier's root (default: a temporary directory, removed afterwards)")
    b.add_argument("--host-gb", type=float, default=8.0, help="the host tier's cap in GiB (kv-store's host_bytes)")
    b.add_argument("--warm-page-cache", action="store_true",
                   help="leave the block files in the page cache (default: dropped before the disk runs)")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_kvstore(a, _ov(a)))


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        lengths = []
    if not lengths or lengths[0] < 2:
        raise ValueError(f"--lengths {text!r}: give prompt lengths of 2 tokens or more, comma-separated "
                         "(e.g. 512,1024,2048)")
    return lengths


def _ttft(llm, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens served from a cache)."""
    t = time.perf_counter()
    out = llm.generate({"prompt_token_ids": prompt}, ONE, use_tqdm=False)[0]
    return time.perf_counter() - t, out.num_cached_tokens or 0


def drop_page_cache(root: str) -> int:
    """Ask the kernel to drop every file under ``root`` from the page cache; the files dropped."""
    n = 0
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


class _Engines:
    """Builds the bench's engines with the run's model and overrides, one at a time."""

    def __init__(self, args, overrides: dict, lengths: list[int]) -> None:
        from deepinfer.bench.models import bench_model

        self.model, ov = bench_model(args, overrides, "bfloat16")
        for key in ("plugins", "plugin_options", "num_kv_blocks"):
            ov.pop(key, None)
        block = ov.get("block_size") or 16
        self.pool_blocks = -(-(lengths[-1] + 1) // block) + 1  # the longest prompt, its token, a spare
        # a filler that (with its token) fills every block of the pool evicts everything else
        self.filler_len = self.pool_blocks * block - 1
        ov["max_model_len"] = max(ov.get("max_model_len") or 0, self.filler_len + 1)
        self.overrides, self.config_file, self.host_bytes = ov, args.config_file, int(args.host_gb * (1 << 30))

    def no_cache(self):
        return self._llm(["no-cache"], {})

    def store(self, directory: str):
        return self._llm(["kv-store"], {"kv-store": {"directory": directory, "host_bytes": self.host_bytes}},
                         num_kv_blocks=self.pool_blocks)

    def _llm(self, plugins: list[str], options: dict, **extra):
        from deepinfer.llm import LLM

        return LLM(self.model, config_file=self.config_file, progress=False, plugins=plugins,
                   plugin_options=options, **self.overrides, **extra)


def run_kvstore(args, overrides: dict) -> int:
    lengths = parse_lengths(args.lengths)
    engines = _Engines(args, overrides, lengths)
    with tempfile.TemporaryDirectory(prefix="deepinfer-kvstore-") as tmp:
        directory = args.dir or tmp
        rows = _measure(engines, lengths, args.repeats, directory, not args.warm_page_cache)
    _print(args, rows)
    write_json(args, rows)
    return 0


def _measure(engines: _Engines, lengths: list[int], repeats: int, directory: str, cold: bool) -> list[dict]:
    llm = engines.no_cache()
    vocab = llm.engine.ctx.model_config["vocab_size"]
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(16, vocab) for _ in range(n)]

    prompts = {n: [fresh(n) for _ in range(repeats)] for n in lengths}
    runs: dict[str, dict[int, list[tuple[float, int, float]]]] = {t: {n: [] for n in lengths} for t in TIERS}
    for n in lengths:
        _ttft(llm, fresh(n))  # warm-up: every length's kernels
        runs["recompute"][n] = [(*_ttft(llm, p), 0.0) for p in prompts[n]]
    progress("kvstore: recompute done")
    llm.shutdown()
    del llm  # (its device memory goes before the next engine takes any)
    _free_device_memory()
    llm = engines.store(directory)
    filler = fresh(engines.filler_len)
    _ttft(llm, filler)
    for n in lengths:
        for p in prompts[n]:
            _ttft(llm, p)  # computed, written through to both tiers
            llm.engine.kv.policies[0].flush()
            _ttft(llm, filler)  # takes every block of the pool: the prompt leaves the device
            runs["host"][n].append(_restore(llm, p, "host"))
    progress("kvstore: host tier done")
    llm.shutdown()
    del llm
    _free_device_memory()
    llm = engines.store(directory)  # a restart: the host tier starts empty
    if cold:
        progress(f"kvstore: {drop_page_cache(directory)} block files dropped from the page cache")
    for n in lengths:
        runs["disk"][n] = [_restore(llm, p, "disk") for p in prompts[n]]
    llm.shutdown()
    return _rows(lengths, runs)


def _restore(llm, prompt: list[int], tier: str) -> tuple[float, int, float]:
    """_ttft of a prompt the store holds, and the bytes its tier read for it (the store's counter)."""
    key = f"deepinfer:kv_store_{tier}_bytes_read"
    before = llm.get_metrics().get(key, 0)
    secs, cached = _ttft(llm, prompt)
    return secs, cached, llm.get_metrics().get(key, 0) - before


def _free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _rows(lengths: list[int], runs: dict) -> list[dict[str, Any]]:
    rows = []
    for n in lengths:
        row: dict[str, Any] = {"prompt_tokens": n}
        for tier in TIERS:
            ms = 1000 * statistics.median(r[0] for r in runs[tier][n])
            row.update({f"{tier}_ms": ms, f"{tier}_us_per_token": 1000 * ms / n,
                        f"{tier}_cached_tokens": min(r[1] for r in runs[tier][n])})
            if tier != "recompute":
                row[f"{tier}_bytes_read"] = statistics.median(r[2] for r in runs[tier][n])
        rows.append(row)
    return rows


def crossover(rows: list[dict], tier: str) -> int | None:
    """The shortest length from which the tier's time stays below recompute's (None: at none)."""
    at = None
    for r in reversed(rows):
        if r[f"{tier}_ms"] >= r["recompute_ms"]:
            break
        at = r["prompt_tokens"]
    return at


def _print(args, rows: list[dict]) -> None:
    table = rows
    print(f"deepinfer bench kvstore: time to the first token of a fresh prompt, median of {args.repeats}; "
          f"disk {'with a warm' if args.warm_page_cache else 'after dropping the'} page cache")
    print(f"{'prompt tokens':>13}{'recompute ms':>14}{'host ms':>10}{'disk ms':>10}{'recompute us/tok':>18}"
          f"{'host us/tok':>13}{'disk us/tok':>13}{'host cached':>13}{'disk cached':>13}")
    for r in table:
        print(f"{r['prompt_tokens']:>13}{r['recompute_ms']:>14.2f}{r['host_ms']:>10.2f}{r['disk_ms']:>10.2f}"
              f"{r['recompute_us_per_token']:>18.2f}{r['host_us_per_token']:>13.2f}{r['disk_us_per_token']:>13.2f}"
              f"{r['host_cached_tokens']:>13}{r['disk_cached_tokens']:>13}")
    for tier in ("host", "disk"):
        at = crossover(rows, tier)
        where = f"from {at} prompt tokens" if at is not None else "at none of these lengths"
        print(f"{tier} restore beats recompute {where}")
    last = table[-1]
    for tier in ("host", "disk"):
        mb = last[f"{tier}_bytes_read"] / 1e6
        print(f"{tier} tier read {mb:.2f} MB for {last['prompt_tokens']} prompt tokens "
              f"({mb / 1e3 / (last[f'{tier}_ms'] / 1e3):.2f} GB/s over its whole time to the first token)")
