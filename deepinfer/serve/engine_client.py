"""The API process's handle on the engine-core process: start it, send commands, route its outputs."""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from deepinfer.core.config import EngineConfig
from deepinfer.core.sampling_params import SamplingParams
from deepinfer.serve.engine_core import run_engine_core


class EngineStartError(RuntimeError):
    """The engine process could not build its engine (bad model, bad plugin, too little memory)."""


class RequestFailed(NamedTuple):
    """The engine refused or lost one request."""

    request_id: str
    status: int
    message: str



class EngineClient:
    """Owns the engine process and the pipe to it.

    Commands go through a sender thread so a busy engine (a full pipe) never blocks the event
    loop; a reader thread receives each step's deltas and hands them to the loop in one callback.
    """

    def __init__(self, config: EngineConfig, threads: int | None = None) -> None:
        self.config = config
        self.threads = threads
        self.info: dict[str, Any] = {}
        self.proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats_waiters: dict[int, asyncio.Future] = {}
        self._tags = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead: str | None = None  # why the engine is gone, once it is
        self.on_dead: Callable[[str], None] | None = None

    # ------------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 600.0) -> dict[str, Any]:
        """Spawn the engine process and wait until it has built its engine (or failed to)."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        # a daemonic process may not start processes: with tensor parallelism the engine spawns its
        # ranks, and ends with the API process through its pipe (EOF) instead
        self.proc = ctx.Process(target=run_engine_core, args=(self.config, child, self.threads),
                                name="deepinfer-engine", daemon=self.config.world_size == 1)
        self.proc.start()
        child.close()
        self._conn = parent
        deadline = time.monotonic() + timeout
        while not parent.poll(0.2):
            if not self.proc.is_alive():
                raise EngineStartError(f"the engine process exited with code {self.proc.exitcode} "
                                       "before it was ready")
            if time.monotonic() > deadline:
                self.kill()
                raise EngineStartError(f"the engine was not ready after {timeout:.0f} s")
        try:
            msg = parent.recv()
        except EOFError:
            msg = ("fatal", f"the engine process exited with code {self.proc.exitcode}")
        if msg[0] != "ready":
            self.proc.join(5)
            self.kill()
            raise EngineStartError(msg[1])
        self.info = msg[1]
        return self.info

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start routing engine outputs into ``loop`` (call once, from the loop's thread)."""
        self._loop = loop
        threading.Thread(target=self._read, name="engine-reader", daemon=True).start()
        threading.Thread(target=self._write, name="engine-writer", daemon=True).start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine process to stop; kill it if it does not within ``timeout``."""
        if self.proc is None:
            return
        if self.proc.is_alive():
            self._outbox.put(("shutdown",))
            self._outbox.put(None)
            self.proc.join(timeout)
        self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)

    @property
    def alive(self) -> bool:
        return self.dead is None and self.proc is not None and self.proc.is_alive()

    # -------------------------------------------------------------------------------- requests
    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams, cache_salt: str | None,
            sink: asyncio.Queue) -> None:
        """Register ``sink`` for the request's deltas and send it to the engine."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        self._queues[request_id] = sink
        self._outbox.put(("add", request_id, prompt_ids, params, cache_salt))

    def abort(self, request_id: str) -> None:
        """Abort a request the caller no longer wants; its blocks are freed in the engine."""
        if self._queues.pop(request_id, None) is not None:
            self._outbox.put(("abort", request_id))

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    async def stats(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """A fresh snapshot of the engine's metrics (None if it does not answer in time)."""
        if not self.alive:
            return None
        tag = next(self._tags)
        fut = asyncio.get_running_loop().create_future()
        self._stats_waiters[tag] = fut
        self._outbox.put(("stats", tag))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            self._stats_waiters.pop(tag, None)

    # ------------------------------------------------------------------------------ IPC threads
    def _write(self) -> None:
        while True:
            first = self._outbox.get()
            if first is None:
                return
            batch = [first]
            while True:  # everything queued meanwhile goes in the same message
                try:
                    nxt = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._outbox.put(None)
                    break
                batch.append(nxt)
            try:
                self._conn.send(batch)
            except (OSError, ValueError):
                return

    def _read(self) -> None:
        conn, loop = self._conn, self._loop
        try:
            while True:
                msg = conn.recv()
                loop.call_soon_threadsafe(self._dispatch, msg)
        except (EOFError, OSError):
            code = self.proc.exitcode if self.proc is not None else None
            loop.call_soon_threadsafe(self._engine_gone, f"the engine process stopped (exit code {code})")
        except RuntimeError:
            pass  # the loop closed first: the server is shutting down

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            queues = self._queues
            for d in msg[1]:
                q = queues.pop(d.request_id, None) if d.finished else queues.get(d.request_id)
                if q is not None:
                    q.put_nowait(d)
        elif kind == "failed":
            for rid, status, message in msg[1]:
                q = self._queues.pop(rid, None)
                if q is not None:
                    q.put_nowait(RequestFailed(rid, status, message))
        elif kind == "fatal":
            self._engine_gone(msg[1])
        elif kind == "stats":
            fut = self._stats_waiters.get(msg[1])
            if fut is not None and not fut.done():
                fut.set_result(msg[2])

    def _engine_gone(self, why: str) -> None:
        if self.dead is not None:  # (told once: a fatal message, then the pipe's end)
            return
        self.dead = why
        for rid, q in list(self._queues.items()):
            q.put_nowait(RequestFailed(rid, 500, why))
        self._queues.clear()
        if self.on_dead is not None:
            self.on_dead(why)


class EngineDeadError(RuntimeError):
    """The engine process is gone; no request can be served."""
