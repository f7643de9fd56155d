"""The store's two tiers below the device: host memory and a directory. Each is bounded in bytes and
evicts expired entries first (each retention class its own time to live since last use), then the
least recently used. Both are used from the engine's thread and the store's IO threads."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from deepinfer_builtin.cache.kv_store.blockfile import CorruptBlock, decode, encode, write_atomic

Count = Callable[[str, float], None]  # (stat name, amount): hits, bytes_read, bytes_written, ...


@dataclass(slots=True)
class _Meta:
    size: int
    retention: str
    last_used: float


class Ledger:
    """Sizes, retention classes and last uses of a tier's entries, least recently used first."""

    def __init__(self, cap_bytes: int, ttls: Mapping[str, float], clock: Callable[[], float]) -> None:
        self.cap_bytes, self.ttls, self.clock = cap_bytes, dict(ttls), clock
        self.entries: OrderedDict[bytes, _Meta] = OrderedDict()
        self.total = 0

    def expired(self, key: bytes) -> bool:
        m = self.entries[key]
        return self.clock() - m.last_used > self.ttls.get(m.retention, 0.0)

    def add(self, key: bytes, size: int, retention: str, last_used: float | None = None) -> None:
        self.entries[key] = _Meta(size, retention, self.clock() if last_used is None else last_used)
        self.total += size

    def touch(self, key: bytes) -> None:
        self.entries[key].last_used = self.clock()
        self.entries.move_to_end(key)

    def pop(self, key: bytes) -> _Meta:
        m = self.entries.pop(key)
        self.total -= m.size
        return m

    def victims(self, room: int = 0) -> list[bytes]:
        """Keys to evict, expired ones first, then least recently used, until ``room`` more bytes fit."""
        out = [k for k in self.entries if self.expired(k)]
        left = self.total - sum(self.entries[k].size for k in out)
        gone = set(out)
        for k, m in self.entries.items():
            if left + room <= self.cap_bytes:
                break
            if k not in gone:
                out.append(k)
                left -= m.size
        return out


class HostTier:
    """Blocks' bytes in host memory (pinned where the device is not the CPU: they come from
    ``KVBlocks.read``), with their token ids."""

    def __init__(self, cap_bytes: int, ttls: Mapping[str, float], clock: Callable[[], float], count: Count) -> None:
        self.ledger = Ledger(cap_bytes, ttls, clock)
        self.data: dict[bytes, tuple[tuple[int, ...], torch.Tensor]] = {}
        self.count = count
        self.lock = threading.Lock()

    def __contains__(self, key: bytes) -> bool:
        with self.lock:
            return key in self.data

    def put(self, key: bytes, tokens: tuple[int, ...], row: torch.Tensor, retention: str) -> None:
        with self.lock:
            if key in self.data:
                self.ledger.touch(key)
                return
            if row.numel() > self.ledger.cap_bytes:
                return
            for k in self.ledger.victims(row.numel()):
                self._evict(k)
            self.ledger.add(key, row.numel(), retention)
            self.data[key] = (tokens, row)

    def get(self, key: bytes, tokens: tuple[int, ...]) -> torch.Tensor | None:
        with self.lock:
            if key not in self.data:
                return None
            if self.ledger.expired(key):
                self._evict(key)
                return None
            have, row = self.data[key]
            if have != tokens:
                return None
            self.ledger.touch(key)
        self.count("host_hits", 1)
        self.count("host_bytes_read", row.numel())
        return row

    def _evict(self, key: bytes) -> None:
        self.ledger.pop(key)
        del self.data[key]
        self.count("host_evictions", 1)


class DirTier:
    """Block files under ``root/<retention>/<2 hex digits>/<key>.kvb``; a block's last use is its
    file's modification time, so retention outlives the process. Another process writing the same
    directory is seen on a lookup (its files are found on disk even when not in this ledger)."""

    def __init__(self, root: str, cap_bytes: int, ttls: Mapping[str, float], clock: Callable[[], float],
                 count: Count, fsync: bool = True) -> None:
        self.root, self.fsync, self.count = root, fsync, count
        self.ledger = Ledger(cap_bytes, ttls, clock)
        self.lock = threading.Lock()
        os.makedirs(root, exist_ok=True)
        self._scan()

    def path(self, key: bytes, retention: str) -> str:
        h = key.hex()
        return os.path.join(self.root, retention, h[:2], h + ".kvb")

    def _scan(self) -> None:
        found = []
        for retention in os.listdir(self.root):
            top = os.path.join(self.root, retention)
            if not os.path.isdir(top):
                continue
            for sub in os.listdir(top):
                for name in os.listdir(os.path.join(top, sub)):
                    path = os.path.join(top, sub, name)
                    if name.endswith(".tmp"):  # a write cut off by a crash: never renamed, never read
                        os.unlink(path)
                    elif name.endswith(".kvb"):
                        st = os.stat(path)
                        found.append((st.st_mtime, bytes.fromhex(name[:-4]), st.st_size, retention))
        for mtime, key, size, retention in sorted(found):
            self.ledger.add(key, size, retention, mtime)
        self.evict_over_cap()

    def _find(self, key: bytes) -> str | None:
        """The key's retention class, from the ledger or from the disk (another writer's file)."""
        m = self.ledger.entries.get(key)
        if m is not None:
            return m.retention
        for retention in self.ledger.ttls:
            try:
                st = os.stat(self.path(key, retention))
            except OSError:
                continue
            self.ledger.add(key, st.st_size, retention, st.st_mtime)
            return retention
        return None

    def __contains__(self, key: bytes) -> bool:
        with self.lock:
            return self._find(key) is not None

    def get(self, key: bytes, tokens: tuple[int, ...]) -> torch.Tensor | None:
        """The block's bytes, or None: absent, expired, or failing a check (then the file is removed
        and counted as corrupt, and the block is computed again)."""
        with self.lock:
            retention = self._find(key)
            if retention is None:
                return None
            if self.ledger.expired(key):
                self._evict(key)
                return None
            path = self.path(key, retention)
        try:
            with open(path, "rb") as f:
                data = f.read()
            _, payload = decode(data, key, tokens)
        except (OSError, CorruptBlock) as e:
            with self.lock:
                if key in self.ledger.entries:
                    self._evict(key)
            self.count("disk_corrupt" if isinstance(e, CorruptBlock) else "disk_read_errors", 1)
            return None
        with self.lock:
            if key in self.ledger.entries:
                self.ledger.touch(key)
                now = self.ledger.clock()
                try:
                    os.utime(path, (now, now))
                except OSError:
                    pass
        self.count("disk_hits", 1)
        self.count("disk_bytes_read", len(data))
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8)

    def put(self, key: bytes, tokens: tuple[int, ...], payload: memoryview, retention: str) -> None:
        with self.lock:
            if self._find(key) is not None:
                return  # written already (by us or by another process): its last use stays the reader's
        data = encode(key, tokens, payload)
        if len(data) > self.ledger.cap_bytes:
            return
        path = self.path(key, retention)
        write_atomic(path, data, self.fsync)
        now = self.ledger.clock()
        os.utime(path, (now, now))
        with self.lock:
            if key not in self.ledger.entries:
                self.ledger.add(key, len(data), retention, now)
            self.evict_over_cap()
        self.count("disk_bytes_written", len(data))

    def evict_over_cap(self) -> None:
        for key in self.ledger.victims():
            self._evict(key)

    def _evict(self, key: bytes) -> None:
        m = self.ledger.pop(key)
        try:
            os.unlink(self.path(key, m.retention))
        except OSError:
            pass
        self.count("disk_evictions", 1)
