"""Run the server: engine process first, then uvicorn; a signal drains in-flight requests and exits 0."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

API_KEY_ENV = "DEEPINFER_API_KEY"


def model_names(config: Any, info: dict[str, Any]) -> list[str]:
    """The name /v1/models reports first, then aliases a client may also send (the path given)."""
    path = info["model_path"]
    hub_id = config.model is not None and not Path(config.model).expanduser().is_dir()  # (its path: a snapshot's)
    names = [config.served_model_name or (config.model if hub_id else Path(path).name)]
    for alias in (config.model, path):
        if alias and alias not in names:
            names.append(alias)
    return names


class _StoppedStarting(Exception):
    """SIGTERM while the engine process was starting."""


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (None: it can). The port is let go at once, so
    another process may still take it before uvicorn does; this catches the common case early."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        return f"cannot resolve the host: {e}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn binds)
        try:
            sock.bind(address)
        except OSError as e:
            return e.strerror or str(e)
    return None


def with_role(config: Any, role: str) -> Any:
    """The config of a prefill or decode instance: both hand KV over through the kv-store
    directory; a prefill instance finishes a request only once its blocks are written there."""
    if role == "both":
        return config
    options = config.plugin_options.get("kv-store") or {}
    if "kv-store" not in config.plugins or not options.get("directory"):
        raise ValueError(f"--role {role} hands KV over through the kv-store policy's directory: add --plugins "
                         "kv-store and --plugin-options '{\"kv-store\": {\"directory\": \"/shared/dir\"}}' "
                         "(the same directory on the prefill and the decode instances)")
    if role == "decode":
        return config
    return config.model_copy(update={"plugin_options": {
        **config.plugin_options, "kv-store": {**options, "durable_finish": True}}})


def run_serve(args: argparse.Namespace, engine_overrides: Callable) -> int:
    from deepinfer.core.config import build_config
    from deepinfer.core.tokenizer import Tokenizer
    from deepinfer.serve.app import ServerSettings, build_app
    from deepinfer.serve.engine_client import EngineClient, EngineStartError
    from deepinfer.serve.http import protocol_with_header_timeout
    from deepinfer.serve.metrics import ServerMetrics
    from deepinfer.serve.parsers import REASONING_GROUP, TOOL_GROUP, load_parser
    from deepinfer.serve.serving import RequestLimits, Serving

    config = with_role(build_config(args.config_file, engine_overrides(args)), getattr(args, "role", "both"))
    if config.world_size > 1 and os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
        # a launcher's rank other than 0: no HTTP server, only this rank's shard, serving rank 0 (the
        # engine process of rank 0's server) until it stops; then this process exits 0
        from deepinfer.builder import build_engine

        build_engine(config, progress=False)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"deepinfer serve: warning: listening on {args.host} without an API key; anyone who can reach "
              f"this port can use it (set --api-key or ${API_KEY_ENV})", file=sys.stderr)
    if (busy := port_in_use(args.host, args.port)) is not None:  # (before minutes of engine start-up)
        print(f"deepinfer serve: error: cannot listen on {args.host}:{args.port}: {busy}; pick another --port "
              "or stop what holds it", file=sys.stderr)
        return 1
    try:  # (an unknown parser is refused before minutes of engine start-up)
        reasoning_parser = (load_parser(REASONING_GROUP, args.reasoning_parser, "--reasoning-parser")
                            if args.reasoning_parser else None)
        tool_parser = (load_parser(TOOL_GROUP, args.tool_call_parser, "--tool-call-parser")
                       if args.tool_call_parser else None)
    except ValueError as e:
        print(f"deepinfer serve: error: {e}", file=sys.stderr)
        return 2
    client = EngineClient(config, threads=args.engine_threads)
    # the engine is built before the port opens: /health answers only once requests can be served.
    # A SIGTERM meanwhile (uvicorn's handlers come later) stops the engine process too: by default
    # it would end this process alone, leaving the engine to build on, orphaned
    def stop_starting(signum: int, _frame: Any) -> None:
        raise _StoppedStarting(signum)

    previous = signal.signal(signal.SIGTERM, stop_starting)
    try:
        info = client.start(timeout=args.engine_start_timeout)
    except EngineStartError as e:
        print(f"deepinfer serve: error: the engine failed to start: {e}", file=sys.stderr)
        return 1
    except (_StoppedStarting, KeyboardInterrupt):
        client.kill()
        print("deepinfer serve: stopped while the engine was starting", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        tokenizer = Tokenizer(info["tokenizer"]) if info["has_tokenizer"] else None
        metrics = ServerMetrics()
        limits = RequestLimits(max_n=args.max_n, max_response_tokens=args.max_response_tokens,
                               max_prompt_chars=args.max_prompt_chars, max_chat_messages=args.max_chat_messages,
                               max_prompt_token_ids=args.max_prompt_token_ids)
        serving = Serving(client, tokenizer, model_names(config, info), metrics,
                          max_in_flight_seqs=config.max_num_seqs + config.max_waiting_requests, limits=limits)
        serving.reasoning_parser, serving.tool_parser = reasoning_parser, tool_parser
        serving.prefill_only = getattr(args, "role", "both") == "prefill"
        settings = ServerSettings(api_key=api_key, max_body_bytes=args.max_body_bytes)
        app = build_app(client, serving, metrics, settings)
        # uvicorn cancels what outlasts its own timeout; the server ends those requests itself at the
        # grace period (DrainingServer.shutdown), and uvicorn's comes later, for their replies to go out
        uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                   access_log=args.access_log,
                                   timeout_graceful_shutdown=args.grace_period + EXPIRY_FLUSH_S,
                                   timeout_keep_alive=args.timeout_keep_alive,
                                   limit_concurrency=args.limit_concurrency,
                                   lifespan="on", loop="asyncio", http=protocol_with_header_timeout(args.header_timeout),
                                   ws="none")

        def expire() -> None:
            if (n := serving.expire(args.grace_period)):
                print(f"deepinfer serve: the {args.grace_period:g} s grace period is over: aborted {n} request"
                      f"{'s' if n != 1 else ''} still running", file=sys.stderr, flush=True)

        server = DrainingServer(uv_config, on_stop=lambda: setattr(serving, "draining", True),
                                grace_period=args.grace_period, on_expire=expire)
        died: list[str] = []

        def engine_died(why: str) -> None:
            if serving.draining:
                return  # we stopped it
            # a server without its engine can only fail requests: exit so a supervisor restarts it
            died.append(why)
            print(f"deepinfer serve: error: {why}; shutting down", file=sys.stderr, flush=True)
            serving.draining = True
            server.should_exit = True

        client.on_dead = engine_died
        print(f"deepinfer serve: serving {serving.model_names[0]!r} (max_model_len {serving.max_model_len}, "
              f"{info['threads']} engine threads) on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
        server.run()
        return 0 if server.started and not died else 1
    finally:
        client.shutdown()


#: seconds uvicorn waits past the grace period, for the replies of the requests aborted then to go out
EXPIRY_FLUSH_S = 3.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but SIGTERM/SIGINT first stop admission, requests that outlast the grace
    period end with an error of their own (``on_expire``), and the exit code stays 0."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None], grace_period: float | None = None,
                 on_expire: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_stop = on_stop
        self.grace_period = grace_period
        self.on_expire = on_expire

    async def shutdown(self, sockets: Any = None) -> None:
        expiry = None
        if self.grace_period is not None and self.on_expire is not None:
            expiry = asyncio.get_running_loop().call_later(self.grace_period, self.on_expire)
        try:
            await super().shutdown(sockets)
        finally:
            if expiry is not None:
                expiry.cancel()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.on_stop()
        # uvicorn re-raises a captured signal once it has stopped, which would end the process
        # with that signal instead of exit code 0 after a clean drain; so it is not recorded
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
