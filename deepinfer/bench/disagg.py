"""`deepinfer bench disagg`: a long-prompt workload on one colocated instance, then on a prefill and a
decode instance behind the router (issue 72); TTFT, ITL and output tok/s of each.

Both runs send the same requests (random prompts of exactly ``--input-len`` token ids, ``--output-len``
tokens each with ``ignore_eos``, at most ``--concurrency`` streams) with `bench serve`'s load generator.
The colocated instance runs alone (`deepinfer serve` with the engine options given); it is stopped
before the disaggregated run starts `deepinfer serve --role prefill` and `--role decode` (both with the
`kv-store` policy on the directory ``--dir``, through which the prompt's KV travels) and
`deepinfer router --prefill URL --decode URL`, so the two instances share the device only with each
other: give each a KV budget (``--kv-cache-memory-gb``, which every instance gets) that fits twice.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deepinfer.bench.output import add_json_arg, progress, write_json
from deepinfer.bench.serve_load import make_workload, run_http

MODES = ("colocated", "disaggregated")


def add_disagg_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("disagg", help="TTFT and throughput: prefill and decode instances behind the router "
                        "against one colocated instance", description=__doc__)
    add_engine_args(b)
    b.add_argument("--random-model", default=None,
                   help="build a random model of this shape instead (llama-1b, ...), with the demo model's tokenizer "
                        "and vocabulary (8192 tokens), so that every token streams")
    b.add_argument("--num-prompts", type=int, default=64)
    b.add_argument("--concurrency", type=int, default=16, help="most requests in flight at once")
    b.add_argument("--input-len", type=int, default=4096, help="prompt tokens per request")
    b.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    b.add_argument("--dir", default=None, metavar="PATH",
                   help="the kv-store directory the two instances share (default: a temporary one, removed)")
    b.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompts")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_disagg(a, _ov(a)))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Processes:
    """The servers and the router a run starts, each logging to a file; stopped together."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *argv: str) -> str:
        port = _free_port()
        log = open(os.path.join(self.log_dir, f"{name}.log"), "w")  # noqa: SIM115 - the process's, closed with it
        cmd = [sys.executable, "-m", "deepinfer.cli", *argv, "--port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        self._wait_healthy(proc, url, name)
        return url

    def _wait_healthy(self, proc: subprocess.Popen, url: str, name: str) -> None:
        import httpx

        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(self.log_dir, f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"`deepinfer {name}` at {url} did not start (exit {proc.returncode}); "
                                   f"the end of its log:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()


def engine_flags(config_file: str | None, overrides: dict) -> list[str]:
    """The engine options of this command as `deepinfer serve` flags (the policy is the bench's)."""
    flags = ["--config", config_file] if config_file else []
    for key, value in overrides.items():
        if key in ("model", "plugins", "plugin_options"):
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, list):
            value = ",".join(map(str, value))
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def decode_store_counts(url: str) -> dict[str, float]:
    """The decode instance's prompt tokens looked up and found in its prefix cache, and the blocks it
    read from the store's directory."""
    import httpx

    names = {"deepinfer:prefix_cache_hits_total": "decode_prefix_hits",
             "deepinfer:prefix_cache_queries_total": "decode_prefix_queries",
             "deepinfer:kv_store_disk_hits_total": "decode_store_blocks"}
    out = dict.fromkeys(names.values(), 0.0)
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


def _load(url: str, workload: list, concurrency: int, seed: int) -> dict[str, Any]:
    from deepinfer.bench.serve import served_name, summarise_http

    results, elapsed = asyncio.run(run_http(url, served_name(url, None), None, workload, concurrency,
                                            float("inf"), seed))
    return summarise_http(results, elapsed)


def run_disagg(args: argparse.Namespace, overrides: dict) -> int:
    from deepinfer.bench.models import bench_model
    from deepinfer.bench.serve import bench_model_dir, config_vocab_size
    from deepinfer.bench.structured import give_tokenizer
    from deepinfer.builder import demo_model_path

    # a random model takes the demo model's tokenizer and vocabulary: a token streams only as text, so
    # without them the first chunk would come with the last token and TTFT would read end to end
    demo_vocab = config_vocab_size(demo_model_path())
    model, overrides = bench_model(args, overrides, "bfloat16", vocab_size=demo_vocab)
    if model is not None and args.random_model:
        give_tokenizer(model)
    model = model or bench_model_dir(args)
    workload = make_workload(args.num_prompts, args.input_len, args.output_len, config_vocab_size(model), args.bench_seed)
    flags = [model, *engine_flags(args.config_file, overrides)]
    report: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="deepinfer-disagg-") as tmp:
        procs = _Processes(tmp)
        try:
            url = procs.start("serve", "serve", *flags)
            report["colocated"] = _load(url, workload, args.concurrency, args.bench_seed)
            progress("disagg: colocated done")
            procs.stop()
            store = json.dumps({"kv-store": {"directory": args.dir or os.path.join(tmp, "kv")}})
            kv = ("--plugins", "kv-store", "--plugin-options", store)
            prefill = procs.start("serve-prefill", "serve", *flags, *kv, "--role", "prefill")
            decode = procs.start("serve-decode", "serve", *flags, *kv, "--role", "decode")
            url = procs.start("router", "router", "--prefill", prefill, "--decode", decode)
            report["disaggregated"] = _load(url, workload, args.concurrency, args.bench_seed)
            report["disaggregated"].update(decode_store_counts(decode))
        finally:
            procs.stop()
    _print(args, report)
    write_json(args, [{"name": mode, **report[mode]} for mode in MODES])
    return 0 if all(report[m]["failed"] == 0 for m in MODES) else 1


def _print(args: argparse.Namespace, report: dict[str, dict[str, Any]]) -> None:
    print(f"deepinfer bench disagg: {args.num_prompts} requests, {args.input_len} prompt / {args.output_len} output "
          f"tokens, concurrency {args.concurrency}")
    print(f"{'mode':<15}{'seconds':>9}{'output tok/s':>14}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}"
          f"{'ITL p50 ms':>12}{'ITL p99 ms':>12}{'failed':>8}")
    for mode in MODES:
        r = report[mode]
        print(f"{mode:<15}{r['duration_s']:>9.2f}{r['output_throughput']:>14.1f}{r['ttft_ms']['p50']:>13.1f}"
              f"{r['ttft_ms']['p99']:>13.1f}{r['itl_ms']['p50']:>12.2f}{r['itl_ms']['p99']:>12.2f}{r['failed']:>8}")
    co, dis = report["colocated"], report["disaggregated"]
    print(f"disaggregated / colocated: output tok/s {dis['output_throughput'] / co['output_throughput']:.3f}, "
          f"TTFT p50 {dis['ttft_ms']['p50'] / co['ttft_ms']['p50']:.3f}, "
          f"TTFT p99 {dis['ttft_ms']['p99'] / co['ttft_ms']['p99']:.3f}")
    print(f"decode instance: {dis['decode_prefix_hits']:.0f} of {dis['decode_prefix_queries']:.0f} prompt tokens "
          f"found in its cache (warm-up included), {dis['decode_store_blocks']:.0f} blocks read from the store")
    for mode in MODES:
        for err in report[mode]["errors"]:
            print(f"  {mode} error: {err}")
