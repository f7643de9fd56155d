"""The `prefix-cache` policy: full KV blocks outlive their request, keyed by a chained hash of
their tokens, and later requests with the same prefix reuse them instead of recomputing."""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from deepinfer.plugins import Block, CachePolicy, PrefixMatch, Request

NAME = "prefix-cache"


class PrefixCacheOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    share_in_flight: bool = True  # hold a request back while another computes the prefix it shares


@dataclass(slots=True)
class _State:
    hashes: list[bytes] = field(default_factory=list)  # chained keys of the request's full blocks
    pending: list[bytes] = field(default_factory=list)  # keys this request announced it computes
    matched: int = -1  # tokens found at the last admission, counted once it is computed


def block_key(parent: bytes, tokens, salt: str | None) -> bytes:
    """128-bit key of a block: its parent's key, its token ids and the request's extra keys."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", tokens).tobytes())
    if salt is not None and not parent:
        h.update(b"\0salt\0" + salt.encode())
    return h.digest()


class PrefixCache(CachePolicy):
    """Shares full blocks by reference count; unreferenced ones stay cached until the pool evicts
    them, least recently used first and a request's tail before its head. A hit also compares the
    token ids, so a hash collision cannot change output."""

    name = NAME
    Options = PrefixCacheOptions

    def __init__(self, options: PrefixCacheOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.block_size = ctx.config.block_size
        self.cached: dict[bytes, Block] = {}
        self.in_flight: dict[bytes, str] = {}  # key -> request computing that block now
        m = ctx.metrics
        m.counter("deepinfer:prefix_cache_queries", "prompt tokens looked up in the prefix cache")
        m.counter("deepinfer:prefix_cache_hits", "prompt tokens found in the prefix cache")
        m.counter("deepinfer:prefix_cache_evicted_blocks", "cached blocks reused for other contents")
        m.gauge("deepinfer:prefix_cache_cached_blocks", "blocks holding a reusable prefix")

    def _state(self, req: Request) -> _State:
        st = req.policy_state.get(NAME)
        if st is None:
            st = req.policy_state[NAME] = _State()
        return st

    def _keys(self, req: Request, num_blocks: int) -> list[bytes]:
        st = self._state(req)
        bs, toks = self.block_size, req.all_token_ids
        while len(st.hashes) < num_blocks:
            i = len(st.hashes)
            parent = st.hashes[-1] if st.hashes else b""
            st.hashes.append(block_key(parent, toks[i * bs:(i + 1) * bs], req.cache_salt))
        return st.hashes[:num_blocks]

    def match(self, request: Request, previous: PrefixMatch) -> PrefixMatch:
        if previous.blocks or request.num_computed_tokens or request.params.prompt_logprobs is not None:
            return previous  # prompt logprobs need every prompt position computed (KVCacheManager too)
        bs = self.block_size
        keys = self._keys(request, (request.num_tokens - 1) // bs)  # always compute the last token
        hits: list[Block] = []
        wait = False
        for i, key in enumerate(keys):
            block = self.cached.get(key)
            if block is None or block.token_ids != tuple(request.all_token_ids[i * bs:(i + 1) * bs]):
                owner = self.in_flight.get(key)
                wait = self.options.share_in_flight and owner is not None and owner != request.request_id
                break
            hits.append(block)
        st = self._state(request)
        st.matched = len(hits) * bs
        if not wait:
            self._announce(request, st)
        return PrefixMatch(hits, len(hits) * bs, wait)

    def on_computed(self, request: Request, blocks: list[Block]) -> None:
        st = self._state(request)
        if st.matched >= 0:  # first step after admission: count the lookup once
            self.ctx.metrics.inc("deepinfer:prefix_cache_queries", request.num_prompt_tokens)
            self.ctx.metrics.inc("deepinfer:prefix_cache_hits", min(st.matched, request.num_prompt_tokens))
            st.matched = -1
        bs = self.block_size
        full = request.num_computed_tokens // bs
        keys = self._keys(request, full)
        for i in range(full):
            block = blocks[i]
            if block.block_hash is not None:
                continue
            key = keys[i]
            if key in self.cached:
                continue  # computed twice concurrently: the first copy stays the cached one
            block.block_hash = key
            block.token_ids = tuple(request.all_token_ids[i * bs:(i + 1) * bs])
            self.cached[key] = block
            if self.in_flight.get(key) == request.request_id:
                del self.in_flight[key]
        self.ctx.metrics.set("deepinfer:prefix_cache_cached_blocks", len(self.cached))

    def _announce(self, request: Request, st: _State) -> None:
        """Mark the prompt blocks this request is about to compute, so peers wait for them; the
        marks go when the blocks are cached or the request lets go of its blocks."""
        if not self.options.share_in_flight:
            return
        keys = self._keys(request, request.num_prompt_tokens // self.block_size)
        for key in keys:
            if key not in self.cached and key not in self.in_flight:
                self.in_flight[key] = request.request_id
                st.pending.append(key)

    def on_free(self, request: Request, blocks: list[Block]) -> None:
        st = request.policy_state.get(NAME)
        if st is None:
            return
        for key in st.pending:
            if self.in_flight.get(key) == request.request_id:
                del self.in_flight[key]
        st.pending.clear()
        st.matched = -1

    def on_evict(self, block: Block) -> None:
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
            self.ctx.metrics.inc("deepinfer:prefix_cache_evicted_blocks")
            self.ctx.metrics.set("deepinfer:prefix_cache_cached_blocks", len(self.cached))
