"""The engine-core process: builds the engine, takes commands from a pipe, sends back per-step deltas.

Messages are plain tuples so pickling stays cheap. API -> engine: one list of commands per send,
each ``("add", rid, prompt_ids, params, cache_salt)``, ``("abort", rid)``, ``("stats", tag)`` or
``("shutdown",)``. Engine -> API: ``("ready", info)`` or ``("fatal", message)`` once at start, then
``("out", [RequestDelta...])`` once per step, ``("failed", [(rid, status, message)...])`` and
``("stats", tag, snapshot)``; ``("fatal", message)`` again before the engine exits non-zero when it
cannot go on (a tensor-parallel rank failed).
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from deepinfer.cli_errors import debug_enabled
from deepinfer.core.config import EngineConfig
from deepinfer.core.logprobs import TokenLogprobs
from deepinfer.parallel.errors import WorkerError


class SeqDelta(NamedTuple):
    """What one of a request's n sequences gained in one step."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    stop_reason: int | str | None


class RequestDelta(NamedTuple):
    """What one request gained in one step; ``finished`` once every sequence is done.
    ``prompt_logprobs`` (asked for in its SamplingParams) comes whole, once, in its first delta."""

    request_id: str
    finished: bool
    seqs: list[SeqDelta]
    num_cached_tokens: int
    prompt_logprobs: list[TokenLogprobs | None] | None = None


STATS_INTERVAL_S = 1.0
_NOT_FINITE = ("the request's logits were not finite (NaN or infinite) at a sampling step, so no token could be "
               "drawn; it was stopped (other requests were not affected)")


class EngineCore:
    """Runs the LLMEngine loop in its own process and turns cumulative outputs into deltas."""

    def __init__(self, engine: Any, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        # per request id, per sequence: (tokens sent, characters of text sent)
        self.sent: dict[str, list[list[int]]] = {}
        self.awaiting_prompt_logprobs: set[str] = set()
        self.running = True
        self.fatal: str | None = None  # why the engine cannot go on (it exits non-zero)
        self.hist: dict[str, list[float]] = {}
        self.last_drain = time.monotonic()

    def loop(self) -> None:
        engine, conn = self.engine, self.conn
        while self.running:
            if engine.has_unfinished_requests():
                while conn.poll(0):  # only what has already arrived: the batch is waiting
                    self.handle(conn.recv())
                if self.running:
                    self.step()
            else:
                self.handle(conn.recv())  # idle: block on the pipe, no busy wait

    def handle(self, cmds: list[tuple]) -> None:
        failed = []
        for cmd in cmds:
            kind = cmd[0]
            if kind == "add":
                _, rid, ids, params, salt = cmd
                try:
                    self.engine.add_request(rid, ids, params, cache_salt=salt)
                    self.sent[rid] = [[0, 0] for _ in range(params.n)]
                    if params.prompt_logprobs is not None:
                        self.awaiting_prompt_logprobs.add(rid)
                except ValueError as e:
                    failed.append((rid, 400, str(e)))
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine
                    traceback.print_exc()
                    failed.append((rid, 500, f"internal error adding the request: {type(e).__name__}: {e}"))
            elif kind == "abort":
                self.engine.abort_request(cmd[1])
                self.sent.pop(cmd[1], None)
                self.awaiting_prompt_logprobs.discard(cmd[1])
            elif kind == "stats":
                self.conn.send(("stats", cmd[1], self.snapshot()))
            elif kind == "shutdown":
                self.running = False
        if failed:
            self.conn.send(("failed", failed))

    def step(self) -> None:
        try:
            outputs = self.engine.step()
        except WorkerError as e:  # a tensor-parallel rank failed: no step can run any more
            print(f"deepinfer engine: {describe_error(e)}", file=sys.stderr, flush=True)
            self.fatal = describe_error(e).splitlines()[0]  # (the rank's traceback: in the log only)
            self.conn.send(("failed", [(rid, 500, self.fatal) for rid in self.engine.requests]))
            self.conn.send(("fatal", self.fatal))
            self.running = False
            return
        except Exception as e:  # noqa: BLE001
            # the failing request cannot be told apart from its batch: fail the batch, keep serving
            traceback.print_exc()
            rids = list(self.engine.requests)
            for rid in rids:
                self.engine.abort_request(rid)
                self.sent.pop(rid, None)
                self.awaiting_prompt_logprobs.discard(rid)
            self.conn.send(("failed", [(rid, 500, f"internal error in the engine step: {describe_error(e)}")
                                       for rid in rids]))
            return
        deltas, failed = [], []
        for out in outputs:
            sent = self.sent.get(out.request_id)
            if sent is None:
                continue
            if out.finished and any(c.finish_reason == "error" for c in out.outputs):
                # its logits were NaN or infinite (the engine ended it alone; the batch went on)
                del self.sent[out.request_id]
                self.awaiting_prompt_logprobs.discard(out.request_id)
                failed.append((out.request_id, 500, _NOT_FINITE))
                continue
            prompt_logprobs = None
            if out.request_id in self.awaiting_prompt_logprobs:
                # nothing of the request goes out before its prompt's logprobs are whole (with n > 1
                # another sequence may sample before the first's prefill ends), so each choice's
                # first chunk can carry them
                if not out.finished and len(out.prompt_logprobs or ()) < len(out.prompt_token_ids):
                    continue
                self.awaiting_prompt_logprobs.discard(out.request_id)
                prompt_logprobs = out.prompt_logprobs
            seqs = []
            for c in out.outputs:
                s = sent[c.index]
                ntok, nchar = s
                if len(c.token_ids) == ntok and len(c.text) == nchar and c.finish_reason is None:
                    continue
                lps = c.logprobs[ntok:] if c.logprobs is not None else None
                seqs.append(SeqDelta(c.index, c.token_ids[ntok:], c.text[nchar:], lps, c.finish_reason,
                                     c.stop_reason))
                s[0], s[1] = len(c.token_ids), len(c.text)
            if out.finished:
                del self.sent[out.request_id]
            if seqs or out.finished or prompt_logprobs is not None:
                deltas.append(RequestDelta(out.request_id, out.finished, seqs, out.num_cached_tokens,
                                           prompt_logprobs))
        if deltas:
            self.conn.send(("out", deltas))
        if failed:
            self.conn.send(("failed", failed))
        self._collect_histograms()

    def _collect_histograms(self) -> None:
        # plugins may observe() every step; keep the engine's lists short between scrapes
        now = time.monotonic()
        if now - self.last_drain < STATS_INTERVAL_S:
            return
        self.last_drain = now
        for name, values in self.engine.metrics.drain_histograms().items():
            self.hist.setdefault(name, []).extend(values)

    def snapshot(self) -> dict[str, Any]:
        self.engine.get_metrics()  # refreshes the gauges
        m = self.engine.metrics
        for name, values in m.drain_histograms().items():
            self.hist.setdefault(name, []).extend(values)
        hist, self.hist = self.hist, {}
        pool = self.engine.kv.pool
        gauges = dict(m.gauges)
        gauges["deepinfer:kv_cache_free_blocks"] = pool.num_free_blocks
        gauges["deepinfer:kv_cache_total_blocks"] = pool.num_blocks
        return {"counters": dict(m.counters), "gauges": gauges, "histograms": hist,
                "descriptions": dict(m.descriptions)}


def describe_error(e: BaseException, input_error: bool = False) -> str:
    """``e`` for the API process's log and replies: its type and message (the message alone for a
    mistake in the input), after the plugin and distribution it was raised in, where it was raised
    in a plugin's code (the command line names them the same way: deepinfer.cli_errors)."""
    from deepinfer.plugins.origin import plugin_origin

    text = str(e) if input_error else f"{type(e).__name__}: {e}"
    origin = plugin_origin(e)
    return text if origin is None else f"in {origin}: {text}"


def engine_info(engine: Any, config: EngineConfig) -> dict[str, Any]:
    """What the API process needs to know about the engine it talks to."""
    return {"model_path": engine.ctx.model_path, "max_model_len": engine.max_model_len,
            "vocab_size": engine.ctx.model_config.get("vocab_size"), "num_blocks": engine.kv.pool.num_blocks,
            "plugins": getattr(engine, "plugin_names", {}), "tokenizer": config.tokenizer or engine.ctx.model_path,
            "has_tokenizer": engine.tokenizer is not None, "threads": _torch_threads()}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def engine_threads(requested: int | None) -> int:
    """Torch threads for an engine on the CPU: all cores but one, which HTTP handling needs.

    Oversubscribed OpenMP threads spin at every barrier while the API process holds their core,
    which made a 2-core machine 8x slower than giving the engine one thread."""
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def run_engine_core(config: EngineConfig, conn: Connection, threads: int | None = None) -> None:
    """Entry point of the engine process (spawned)."""
    # read by OpenMP when torch loads: idle workers sleep instead of spinning on a shared core
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # the API process decides when to stop: a terminal's Ctrl-C or a service manager signalling the
    # whole group must not kill requests the API process is still draining
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from deepinfer.builder import build_engine

        engine = build_engine(config, progress=False)
        if engine.ctx.device.torch_device.type == "cpu" and (threads or "OMP_NUM_THREADS" not in os.environ):
            import torch

            torch.set_num_threads(engine_threads(threads))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which exits non-zero
        if debug_enabled():
            traceback.print_exc()
        conn.send(("fatal", describe_error(e, input_error=isinstance(e, ValueError))))
        conn.close()
        return
    conn.send(("ready", engine_info(engine, config)))
    core = EngineCore(engine, conn)
    try:
        core.loop()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the API process went away: nothing left to serve
    finally:
        engine.shutdown()
        sys.stdout.flush()
    if core.fatal is not None:
        sys.exit(1)
