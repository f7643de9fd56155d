"""`deepinfer serve [MODEL]`: start the engine process, then the OpenAI-compatible HTTP server."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

API_KEY_ENV = "DEEPINFER_API_KEY"


def add_serve_parser(sub, add_engine_args: Callable, engine_overrides: Callable) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server",
                       description="Serve MODEL (default: the embedded demo model) over OpenAI's HTTP API.")
    configure_parser(p, add_engine_args, engine_overrides)


def configure_parser(p: argparse.ArgumentParser, add_engine_args: Callable, engine_overrides: Callable) -> None:
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: only this machine; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/*, /metrics and /openapi.json (default: ${API_KEY_ENV})")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model directory's name)")
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="queued requests beyond max_num_seqs before new ones get 503 (engine option)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body accepted (413 above)")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds SIGTERM waits for in-flight requests before aborting them (503 / an error event)")
    # request limits (docs/serve.md, "Limits")
    p.add_argument("--max-n", type=int, default=32, help="largest n (choices per prompt) accepted (400 above)")
    p.add_argument("--max-response-tokens", type=int, default=262_144,
                   help="bound on a non-streamed reply: prompts x n x max_tokens x (1 + logprobs) (400 above)")
    p.add_argument("--max-prompt-chars", type=int, default=None,
                   help="longest prompt text (or chat messages' text) tokenized; longer ones get 400 before "
                        "tokenizing (default: 16 x max_model_len)")
    p.add_argument("--max-prompt-token-ids", type=int, default=None,
                   help="longest prompt sent as token ids (default: max_model_len)")
    p.add_argument("--max-chat-messages", type=int, default=2048, help="most messages in one chat request")
    # connection limits (uvicorn's, plus a header read timeout)
    p.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="seconds an idle keep-alive connection stays open")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection has to send a whole request head before it is closed")
    p.add_argument("--limit-concurrency", type=int, default=1024,
                   help="connections and requests at once before new requests get 503")
    p.add_argument("--engine-threads", type=int, default=None,
                   help="torch threads of the engine process on a CPU device (default: $OMP_NUM_THREADS, "
                        "else every core but one, left to HTTP handling)")
    p.add_argument("--engine-start-timeout", type=float, default=900.0)
    p.add_argument("--role", default="both", choices=["both", "prefill", "decode"],
                   help="prefill: compute prompts' KV into the kv-store directory and answer one token; decode: "
                        "continue requests whose prompt KV a prefill instance stored there (both need --plugins "
                        "kv-store with a directory shared by the two; the router pairs them)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument("--reasoning-parser", default=None,
                   help="split chat replies' reasoning into reasoning_content (deepseek_r1: text up to </think>)")
    p.add_argument("--tool-call-parser", default=None,
                   help="read tool calls from chat replies in the model's format (hermes, deepseek_v3)")
    p.set_defaults(func=lambda args: _run(args, engine_overrides))


def _run(args: argparse.Namespace, engine_overrides: Callable) -> int:
    from deepinfer.serve.server import run_serve

    return run_serve(args, engine_overrides)


def main(argv: list[str] | None = None) -> int:
    """``python -m deepinfer.serve [MODEL] [flags]``: the serve command on its own."""
    from deepinfer.cli import add_engine_args, engine_overrides

    parser = argparse.ArgumentParser(prog="deepinfer serve",
                                     description="Serve MODEL over OpenAI's HTTP API.")
    configure_parser(parser, add_engine_args, engine_overrides)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"deepinfer serve: error: {e}", file=sys.stderr)
        return 2
