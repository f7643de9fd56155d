"""`deepinfer bench router`: multi-turn conversations through the router over N `deepinfer serve`
instances, once per routing policy; the instances' prefix-cache hit rate under each."""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from deepinfer.bench.output import add_json_arg, write_json

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]


def add_router_bench_parser(bsub) -> None:
    b = bsub.add_parser("router", help="prefix-cache hit rate through the router, per routing policy")
    b.add_argument("model", nargs="?", default=None, help="model directory (default: the demo model)")
    b.add_argument("--instances", type=int, default=4)
    b.add_argument("--conversations", type=int, default=24)
    b.add_argument("--turns", type=int, default=4)
    b.add_argument("--concurrency", type=int, default=8, help="conversations in flight at once")
    b.add_argument("--turn-words", type=int, default=40, help="words a turn adds to its conversation")
    b.add_argument("--max-tokens", type=int, default=16)
    b.add_argument("--threshold", type=int, default=4)
    b.add_argument("--num-kv-blocks", type=int, default=256, help="each instance's KV pool")
    b.add_argument("--policies", default="cache-aware,round-robin")
    b.add_argument("--seed", type=int, default=0)
    add_json_arg(b)
    b.set_defaults(func=run_router_bench)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_instances(args: argparse.Namespace) -> list[tuple[subprocess.Popen, str]]:
    out = []
    for _ in range(args.instances):
        port = _free_port()
        cmd = [sys.executable, "-m", "deepinfer.cli", "serve", *([args.model] if args.model else []),
               "--port", str(port), "--plugins", "prefix-cache", "--num-kv-blocks", str(args.num_kv_blocks),
               "--engine-threads", "1", "--log-level", "warning"]
        log = tempfile.NamedTemporaryFile("w+", prefix="deepinfer-bench-router-", suffix=".log", delete=False)  # noqa: SIM115
        out.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}),
                    f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 600
    for proc, url in out:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"instance {url} did not start (exit {proc.returncode}); see its log in "
                                   f"{tempfile.gettempdir()}/deepinfer-bench-router-*.log")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    return out


def _counts(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("deepinfer:prefix_cache_hits_total "):
                hits += float(line.split()[1])
            elif line.startswith("deepinfer:prefix_cache_queries_total "):
                queries += float(line.split()[1])
    return hits, queries


async def _conversations(args: argparse.Namespace, client: httpx.AsyncClient, model: str, tag: str) -> None:
    rng = random.Random(f"{args.seed}:{tag}")
    gate = asyncio.Semaphore(args.concurrency)

    async def one(c: int) -> None:
        text = f"[{tag} conversation {c}]"
        async with gate:
            for _ in range(args.turns):
                text += " user: " + " ".join(rng.choice(WORDS) for _ in range(args.turn_words)) + "\nassistant:"
                r = await client.post("/v1/completions", json={"model": model, "prompt": text, "temperature": 0,
                                                               "max_tokens": args.max_tokens})
                r.raise_for_status()
                text += r.json()["choices"][0]["text"]

    await asyncio.gather(*(one(c) for c in range(args.conversations)))


def run_router_bench(args: argparse.Namespace) -> int:
    from deepinfer.router.app import Router, build_app

    instances = _start_instances(args)
    urls = [u for _, u in instances]
    results = []
    model = httpx.get(urls[0] + "/v1/models", timeout=30).json()["data"][0]["id"]
    try:
        print(f"{args.instances} instances, {args.conversations} conversations x {args.turns} turns, "
              f"concurrency {args.concurrency}, pool {args.num_kv_blocks} blocks each")
        print("| policy | hit rate | requests per instance | seconds |")
        print("| --- | --- | --- | --- |")
        for policy in args.policies.split(","):
            router = Router(urls, policy, args.threshold)

            async def go(router=router, policy=policy) -> None:
                transport = httpx.ASGITransport(build_app(router))
                async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=600) as c:
                    await _conversations(args, c, model, policy)

            h0, q0 = _counts(urls)
            start = time.perf_counter()
            asyncio.run(go())
            seconds = time.perf_counter() - start
            h1, q1 = _counts(urls)
            rate = (h1 - h0) / max(q1 - q0, 1)
            print(f"| {policy} | {rate:.1%} | {'/'.join(map(str, router.routed))} | {seconds:.1f} |")
            results.append({"policy": policy, "hit_rate": rate, "routed": list(router.routed), "seconds": seconds})
        write_json(args, results)
    finally:
        for proc, _ in instances:
            proc.terminate()
        for proc, _ in instances:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0
