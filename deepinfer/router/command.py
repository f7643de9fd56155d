"""`deepinfer router --instances URL,...`: the router on uvicorn."""
from __future__ import annotations

import argparse

from deepinfer.router.policy import POLICIES


def add_router_parser(sub) -> None:
    p = sub.add_parser("router", help="one entry point in front of several deepinfer serve instances",
                       description="Route OpenAI requests to the instance most likely to hold their prefix.")
    p.add_argument("--instances", default=None, help="comma-separated base URLs (http://host:port) of colocated "
                   "instances")
    p.add_argument("--prefill", default=None, help="disaggregated: the prefill instances' URLs (--role prefill)")
    p.add_argument("--decode", default=None, help="disaggregated: the decode instances' URLs (--role decode)")
    p.add_argument("--policy", default="cache-aware", choices=list(POLICIES),
                   help="cache-aware (default), or round-robin to compare against")
    p.add_argument("--threshold", type=int, default=4,
                   help="requests in flight by which the prefix's instance may exceed the least loaded one "
                        "before the least loaded is chosen instead")
    p.add_argument("--chunk-chars", type=int, default=64, help="characters of prompt per prefix hash")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds an instance may take to answer")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run_router)


def run_router(args: argparse.Namespace) -> int:
    import uvicorn

    from deepinfer.router.app import Router, build_app

    def split(text: str | None) -> list[str]:
        return [u.strip() for u in (text or "").split(",") if u.strip()]

    if bool(args.instances) == bool(args.prefill or args.decode) or bool(args.prefill) != bool(args.decode):
        raise ValueError("give --instances URL,... (colocated) or both --prefill URL,... and --decode URL,... "
                         "(disaggregated)")
    urls = split(args.instances) or split(args.decode)
    router = Router(urls, args.policy, args.threshold, args.chunk_chars, args.timeout, prefill=split(args.prefill))
    uvicorn.run(build_app(router), host=args.host, port=args.port, log_level=args.log_level)
    return 0
