"""The store's IO off the engine's thread: one writer that takes blocks copied out of the device
into the host tier and then the directory tier, and prefetchers that bring a request's blocks from
the directory into host memory before the request is scheduled."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from deepinfer_builtin.cache.kv_store.tiers import Count, DirTier, HostTier

Entry = tuple[bytes, tuple[int, ...], str]  # (store key, token ids, retention class)


class StoreIO:
    """Owns the writer thread and the prefetch threads of one store."""

    def __init__(self, host: HostTier, disk: DirTier | None, count: Count, pinned: bool) -> None:
        self.host, self.disk, self.count, self.pinned = host, disk, count, pinned
        self._writes: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-store-writer", daemon=True)
        self._writer.start()
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="kv-store-prefetch")

    def write(self, entries: Sequence[Entry], rows: torch.Tensor, ready: Callable[[], None]) -> None:
        """Queue blocks whose bytes ``rows`` hold once ``ready()`` returns (a copy still under way)."""
        self._writes.put((list(entries), rows, ready))

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            try:
                if job is None:
                    return
                self._write(*job)
            finally:
                self._writes.task_done()

    def _write(self, entries: list[Entry], rows: torch.Tensor, ready: Callable[[], None]) -> None:
        ready()
        for (key, tokens, retention), row in zip(entries, rows, strict=True):
            keep = torch.empty(row.numel(), dtype=torch.uint8, pin_memory=self.pinned)
            keep.copy_(row)
            self.host.put(key, tokens, keep, retention)
            self.count("host_bytes_written", keep.numel())
            if self.disk is not None:
                try:
                    self.disk.put(key, tokens, memoryview(keep.numpy()), retention)
                except OSError:
                    self.count("disk_write_errors", 1)

    def prefetch(self, entries: Sequence[Entry]) -> Future:
        """Read the consecutive blocks of ``entries`` found in the directory into host memory (up to
        the first missing one); the future's result is how many."""
        return self._readers.submit(self._prefetch, list(entries))

    def _prefetch(self, entries: list[Entry]) -> int:
        n = 0
        for key, tokens, retention in entries:
            if key in self.host:
                n += 1
                continue
            row = self.disk.get(key, tokens) if self.disk is not None else None
            if row is None:
                break
            keep = torch.empty(row.numel(), dtype=torch.uint8, pin_memory=self.pinned)
            keep.copy_(row)
            self.host.put(key, tokens, keep, retention)
            n += 1
        return n

    def flush(self) -> None:
        """Wait until every queued write is in its tiers."""
        self._writes.join()

    def close(self) -> None:
        self.flush()
        self._writes.put(None)
        self._writer.join()
        self._readers.shutdown(wait=True)
