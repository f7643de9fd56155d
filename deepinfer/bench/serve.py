"""`deepinfer bench serve`: load a server over HTTP, optionally compare with the offline engine."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deepinfer.bench.serve_load import http_ttft, make_workload, offline_throughput, offline_ttft, percentiles, run_http


def add_bench_serve_parser(bench_sub) -> argparse.ArgumentParser:
    """Register ``serve`` under ``deepinfer bench``."""
    p = bench_sub.add_parser("serve", help="load generator for `deepinfer serve` (throughput, TTFT/ITL)",
                             description=__doc__)
    configure_parser(p)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    from deepinfer.cli import add_engine_args

    add_engine_args(p)
    p.add_argument("--base-url", default=None,
                   help="a running server (default: start `deepinfer serve MODEL` on a free loopback port)")
    p.add_argument("--api-key", default=None, help="bearer key of the server (default: $DEEPINFER_API_KEY)")
    p.add_argument("--model-name", default=None, help="model name to send (default: the first of /v1/models)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight at once")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson (default: all now)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--ttft-requests", type=int, default=20,
                   help="prompts sent one at a time to measure TTFT on an idle server (0: skip)")
    p.add_argument("--offline", action="store_true",
                   help="also run the offline engine on the same requests and print HTTP/offline ratios")
    p.add_argument("--engine-threads", type=int, default=None,
                   help="passed to the server this command starts (see `deepinfer serve --help`)")
    p.add_argument("--offline-threads", type=int, default=None,
                   help="torch threads of the offline run (default: torch's, every core)")
    p.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompts and arrivals")
    p.add_argument("--json", "--json-out", dest="json_out", default=None, metavar="FILE",
                   help="write the results as JSON to this file (--json-out: its older name)")
    p.set_defaults(func=run_bench_serve)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_flags(args: argparse.Namespace) -> list[str]:
    from deepinfer.cli import engine_overrides

    flags = ["--config", args.config_file] if args.config_file else []
    for key, value in engine_overrides(args).items():
        if key == "model":
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, list):
            value = ",".join(value)
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


class _LaunchedServer:
    """`deepinfer serve` started by the benchmark, stopped with SIGTERM when it is done."""

    def __init__(self, args: argparse.Namespace, api_key: str | None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "deepinfer.serve", *([args.model] if args.model else []),
               "--port", str(self.port), "--log-level", "warning", *_engine_flags(args)]
        if args.engine_threads:
            cmd += ["--engine-threads", str(args.engine_threads)]
        env = {**os.environ, **({"DEEPINFER_API_KEY": api_key} if api_key else {})}
        self.proc = subprocess.Popen(cmd, env=env)
        import httpx

        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`deepinfer serve` exited with code {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("`deepinfer serve` did not become healthy within 900 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def bench_model_dir(args: argparse.Namespace) -> str:
    """The model directory of the run: the one given, else the demo model."""
    if args.model:
        return args.model
    from deepinfer.builder import demo_model_path

    return demo_model_path()


def config_vocab_size(model_dir: str) -> int:
    """The vocabulary size in a model directory's config.json (a multimodal one's text_config too)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))


def served_name(url: str, api_key: str | None) -> str:
    """The first model name a server (or the router) lists at /v1/models."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(f"{url}/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def summarise_http(results: list, elapsed: float) -> dict[str, Any]:
    """Throughput and TTFT / ITL / end-to-end percentiles (ms) of one HTTP run."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    return {"requests": len(results), "failed": len(results) - len(ok), "duration_s": elapsed,
            "request_throughput": len(ok) / elapsed, "output_throughput": out_tokens / elapsed,
            "ttft_ms": {k: v * 1000 for k, v in percentiles([r.ttft for r in ok]).items()},
            "itl_ms": {k: v * 1000 for k, v in percentiles([x for r in ok for x in r.itls]).items()},
            "e2e_ms": {k: v * 1000 for k, v in percentiles([r.e2e for r in ok]).items()},
            "errors": sorted({r.error for r in results if not r.ok})[:5]}


def run_bench_serve(args: argparse.Namespace) -> int:
    model_dir = bench_model_dir(args)
    api_key = args.api_key or os.environ.get("DEEPINFER_API_KEY") or None
    workload = make_workload(args.num_prompts, args.input_len, args.output_len, config_vocab_size(model_dir),
                             args.bench_seed)
    probe = workload[:args.ttft_requests]
    report: dict[str, Any] = {"config": {k: getattr(args, k) for k in (
        "num_prompts", "concurrency", "request_rate", "input_len", "output_len", "ttft_requests")},
        "model": model_dir}
    launched = None if args.base_url else _LaunchedServer(args, api_key)
    url = args.base_url or launched.url
    try:
        name = args.model_name or served_name(url, api_key)
        if probe:
            report["http_ttft_alone_ms"] = {k: v * 1000 for k, v in
                                            percentiles(asyncio.run(http_ttft(url, name, api_key, probe))).items()}
        results, elapsed = asyncio.run(run_http(url, name, api_key, workload, args.concurrency, args.request_rate,
                                                args.bench_seed))
        report["http"] = summarise_http(results, elapsed)
    finally:
        if launched is not None:
            launched.stop()  # the offline run gets the machine to itself
    if args.offline:
        report["offline"] = _run_offline(args, workload, probe)
        _add_ratios(report)
    _print(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0 if report["http"]["failed"] == 0 else 1


def _run_offline(args: argparse.Namespace, workload: list, probe: list) -> dict[str, Any]:
    import torch

    from deepinfer.cli import engine_overrides
    from deepinfer.llm import LLM

    if args.offline_threads:
        torch.set_num_threads(args.offline_threads)

    ov = engine_overrides(args)
    ov.pop("model", None)
    # the same batch the server had: at most `concurrency` sequences at once
    ov["max_num_seqs"] = min(args.concurrency, ov.get("max_num_seqs", args.concurrency))
    llm = LLM(args.model, config_file=args.config_file, progress=False, **ov)
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    if probe:
        out["ttft_alone_ms"] = {k: v * 1000 for k, v in percentiles(offline_ttft(llm.engine, probe)).items()}
    seconds, tokens = offline_throughput(llm, workload)
    out.update(duration_s=seconds, output_throughput=tokens / seconds)
    return out


def _add_ratios(report: dict[str, Any]) -> None:
    off, http = report["offline"], report["http"]
    ratios = {"throughput_http_over_offline": http["output_throughput"] / off["output_throughput"]}
    if "ttft_alone_ms" in off and "http_ttft_alone_ms" in report:
        h, o = report["http_ttft_alone_ms"], off["ttft_alone_ms"]
        ratios.update(ttft_p50_overhead_ms=h["p50"] - o["p50"], ttft_p50_http_over_offline=h["p50"] / o["p50"])
    report["ratios"] = ratios


def _print(report: dict[str, Any]) -> None:
    http = report["http"]
    cfg = report["config"]
    print(f"deepinfer bench serve: {cfg['num_prompts']} requests, {cfg['input_len']} in / {cfg['output_len']} out "
          f"tokens, concurrency {cfg['concurrency']}, rate {cfg['request_rate']}")
    print(f"  HTTP       {http['duration_s']:.2f} s  {http['request_throughput']:.2f} req/s  "
          f"{http['output_throughput']:.1f} output tok/s  failed {http['failed']}")
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        v = http[key]
        print(f"  {key[:-3].upper():<10} mean {v['mean']:.2f}  p50 {v['p50']:.2f}  p90 {v['p90']:.2f}  "
              f"p99 {v['p99']:.2f} ms")
    if "http_ttft_alone_ms" in report:
        print(f"  TTFT alone (HTTP)     p50 {report['http_ttft_alone_ms']['p50']:.2f} ms")
    if "offline" in report:
        off = report["offline"]
        if "ttft_alone_ms" in off:
            print(f"  TTFT alone (offline)  p50 {off['ttft_alone_ms']['p50']:.2f} ms")
        print(f"  offline    {off['duration_s']:.2f} s  {off['output_throughput']:.1f} output tok/s  "
              f"({off['threads']} torch threads)")
        for k, v in report["ratios"].items():
            print(f"  {k:<32} {v:.3f}")
    for err in http["errors"]:
        print(f"  error: {err}")


def main(argv: list[str] | None = None) -> int:
    """``python -m deepinfer.bench.serve``: the benchmark on its own."""
    parser = argparse.ArgumentParser(prog="deepinfer bench serve", description=__doc__)
    configure_parser(parser)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
