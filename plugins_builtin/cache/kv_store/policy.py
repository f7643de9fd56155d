"""The `kv-store` policy: prefix-cache whose blocks also live in host memory and in a directory.

Every block prefix-cache makes reusable is copied out of the device once (write-through, queued
behind the step that computed it) and written by a background thread to the host tier, then to
the directory tier. A request whose prefix runs past the device's cached blocks waits one
admission while its blocks are read from the directory into host memory (prefetch), then takes
the host tier's blocks into fresh device blocks. Keys are prefix-cache's chained block keys (the
request's ``cache_salt`` at their root) hashed with the model's identity and the KV layout."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import Future

from pydantic import Field, model_validator

from deepinfer.plugins import Block, PluginError, PrefixMatch, Request, hookimpl
from deepinfer_builtin.cache.kv_store.io import Entry, StoreIO
from deepinfer_builtin.cache.kv_store.tiers import DirTier, HostTier
from deepinfer_builtin.cache.prefix_cache import PrefixCache, PrefixCacheOptions

NAME = "kv-store"
DAY = 86400.0
STATS = {
    "host_hits": "blocks found in the host tier", "host_bytes_read": "bytes restored from the host tier",
    "host_bytes_written": "bytes written to the host tier", "host_evictions": "blocks evicted from the host tier",
    "disk_hits": "blocks read from the directory tier", "disk_bytes_read": "bytes read from the directory tier",
    "disk_bytes_written": "bytes written to the directory tier",
    "disk_evictions": "block files removed (TTL or size cap)",
    "disk_corrupt": "block files that failed a check (removed, recomputed)",
    "disk_read_errors": "block files that could not be read", "disk_write_errors": "block files not written",
}


class KVStoreOptions(PrefixCacheOptions):
    directory: str | None = None  # the directory tier's root (any POSIX mount); None: host tier only
    host_bytes: int = Field(1 << 30, ge=0)  # the host tier's cap
    disk_bytes: int = Field(100 << 30, ge=0)  # the directory tier's cap (this model's entries)
    retention: dict[str, float] = Field(default_factory=lambda: {"agent": 3 * DAY, "chat": 7 * DAY})
    default_retention: str = "chat"  # for requests without kv_retention or with a class not listed
    fsync: bool = True  # each block file is synced before its rename
    model_id: str | None = None  # the model's identity in keys; default: a hash of config and weight files
    durable_finish: bool = False  # a request finishes only once its blocks are written (a prefill instance)

    @model_validator(mode="after")
    def _default_listed(self) -> KVStoreOptions:
        if self.default_retention not in self.retention:
            raise ValueError(f"default_retention {self.default_retention!r} is not one of the retention "
                             f"classes {sorted(self.retention)}")
        for name, ttl in self.retention.items():
            if ttl <= 0 or not name.isidentifier():
                raise ValueError(f"retention class {name!r}: a name of letters, digits and _ and a TTL "
                                 f"in seconds above 0, not {ttl}")
        return self


def model_identity(model_path: str | None) -> str:
    """A hash of the model's config.json and its weight files' names and sizes."""
    h = hashlib.blake2b(digest_size=16)
    if model_path and os.path.isdir(model_path):
        with open(os.path.join(model_path, "config.json"), "rb") as f:
            h.update(f.read())
        for name in sorted(os.listdir(model_path)):
            if name.endswith((".safetensors", ".bin", ".pt")):
                h.update(f"{name}:{os.path.getsize(os.path.join(model_path, name))}".encode())
    return h.hexdigest()


class KVStore(PrefixCache):
    """prefix-cache plus a host-memory tier and a directory tier below the device pool."""

    name = NAME
    Options = KVStoreOptions
    excludes = ("prefix-cache", "no-cache", "swa-replay")

    def __init__(self, options: KVStoreOptions, ctx) -> None:
        super().__init__(options, ctx)
        if ctx.config.tensor_parallel_size > 1:
            raise PluginError("kv-store keeps rank 0's KV alone; it cannot run with tensor_parallel_size "
                              f"{ctx.config.tensor_parallel_size}: use prefix-cache there")
        self.clock = time.time  # (tests replace it before the engine starts)
        self.io: StoreIO | None = None
        self._lock = threading.Lock()
        for stat, text in STATS.items():
            ctx.metrics.counter(f"deepinfer:kv_store_{stat}", text)

    def _count(self, stat: str, amount: float) -> None:
        with self._lock:  # (the IO threads count too)
            self.ctx.metrics.inc(f"deepinfer:kv_store_{stat}", amount)

    @hookimpl
    def deepinfer_engine_started(self) -> None:
        kv_blocks = self.ctx.kv_blocks
        if kv_blocks is None:
            raise PluginError("kv-store cannot copy KV blocks out of this attention backend's cache (no "
                              "block or slot dimension in its layout); use prefix-cache with it")
        o = self.options
        ident = o.model_id or model_identity(self.ctx.model_path)
        self.namespace = hashlib.blake2b(f"{ident}|{kv_blocks.layout}|{self.block_size}".encode(),
                                         digest_size=16).digest()
        host = HostTier(o.host_bytes, o.retention, lambda: self.clock(), self._count)
        disk = None
        if o.directory is not None:
            root = os.path.join(o.directory, self.namespace.hex())
            disk = DirTier(root, o.disk_bytes, o.retention, lambda: self.clock(), self._count, o.fsync)
        self.io = StoreIO(host, disk, self._count, pinned=kv_blocks.device.type != "cpu")

    @hookimpl
    def deepinfer_engine_stopped(self) -> None:
        if self.io is not None:
            self.io.close()
            self.io = None

    @hookimpl
    def deepinfer_request_finished(self) -> None:
        if self.options.durable_finish and self.io is not None:
            self.io.flush()  # (before its output leaves the engine: a decode instance finds every block)

    def flush(self) -> None:
        """Wait until every block computed so far is in its tiers."""
        if self.io is not None:
            self.io.flush()

    def _entries(self, request: Request, keys: list[bytes], start: int) -> list[Entry]:
        bs, toks = self.block_size, request.all_token_ids
        retention = request.params.kv_retention
        if retention not in self.options.retention:
            retention = self.options.default_retention
        return [(hashlib.blake2b(self.namespace + k, digest_size=16).digest(),
                 tuple(toks[i * bs:(i + 1) * bs]), retention) for i, k in enumerate(keys[start:], start)]

    def match(self, request: Request, previous: PrefixMatch) -> PrefixMatch:
        m = super().match(request, previous)
        if (self.io is None or m.wait or previous.blocks or request.num_computed_tokens
                or request.params.prompt_logprobs is not None):
            return m
        keys = self._keys(request, (request.num_tokens - 1) // self.block_size)
        if len(m.blocks) == len(keys):
            return m
        entries = self._entries(request, keys, len(m.blocks))
        state = request.policy_state.setdefault(NAME, {})
        fut: Future | None = state.get("prefetch")
        if fut is None and self.io.disk is not None and entries[0][0] not in self.io.host \
                and entries[0][0] in self.io.disk:
            # held back until its blocks are in host memory; once a request (a host tier too small
            # for them would otherwise send it back to the disk at every admission)
            state["prefetch"] = self.io.prefetch(entries)
            return PrefixMatch(m.blocks, m.num_tokens, True)
        if fut is not None and not fut.done():
            return PrefixMatch(m.blocks, m.num_tokens, True)
        rows = []
        for key, tokens, _ in entries:
            row = self.io.host.get(key, tokens)
            if row is None:
                break
            rows.append(row)
        return self._restore(request, m, keys, rows) if rows else m

    def _restore(self, request: Request, m: PrefixMatch, keys: list[bytes], rows: list) -> PrefixMatch:
        """Copy host rows into fresh device blocks, cached as prefix-cache caches computed ones.
        Only where the pool keeps a block to spare for the request's next step."""
        pool = self.ctx.kv.pool
        revived = sum(1 for b in m.blocks if b.ref_cnt == 0)
        rows = rows[:max(0, pool.num_free_blocks - revived - 1)]
        if not rows:
            return m
        pool.touch(m.blocks)  # (taken for the allocation: it may not evict the match itself)
        blocks: list[Block] = pool.allocate(len(rows))
        self.ctx.kv_blocks.write([b.block_id for b in blocks], rows)  # (pinned rows: one copy each)
        bs, toks, start = self.block_size, request.all_token_ids, len(m.blocks)
        st = self._state(request)
        for i, block in enumerate(blocks, start):
            block.block_hash = keys[i]
            block.token_ids = tuple(toks[i * bs:(i + 1) * bs])
            self.cached[block.block_hash] = block
            if self.in_flight.get(keys[i]) == request.request_id:
                del self.in_flight[keys[i]]
        pool.free(reversed(blocks))  # cached, unreferenced: the manager takes them with the match
        pool.free(m.blocks)
        hits = [*m.blocks, *blocks]
        st.matched = len(hits) * bs
        self.ctx.metrics.set("deepinfer:prefix_cache_cached_blocks", len(self.cached))
        return PrefixMatch(hits, len(hits) * bs)

    def on_computed(self, request: Request, blocks: list[Block]) -> None:
        full = min(request.num_computed_tokens // self.block_size, len(blocks))
        fresh = [i for i in range(full) if blocks[i].block_hash is None]
        super().on_computed(request, blocks)
        if self.io is None:
            return
        new = [i for i in fresh if blocks[i].block_hash is not None and self.cached.get(blocks[i].block_hash)
               is blocks[i]]
        if not new:
            return
        keys = self._keys(request, full)
        entries = [e for i in new for e in self._entries(request, keys[:i + 1], i)]
        keep = [j for j, e in enumerate(entries) if e[0] not in self.io.host]
        if keep:
            rows, ready = self.ctx.kv_blocks.read([blocks[new[j]].block_id for j in keep])
            self.io.write([entries[j] for j in keep], rows, ready)
