"""The `swa-replay` policy: bounded replay of sliding-window layers over the prefix cache.

It keeps the sliding-window layers' KV in a pool of their own (KV group 1), where a running
request holds only the blocks its window still reads. Every ``replay_interval`` (R) tokens it
keeps a checkpoint: the sliding-window blocks a request needs to resume at that position, tied
to the prefix-cache blocks before it. A request that hits P cached tokens resumes at the last
surviving checkpoint c <= P and replays tokens c..P through the model; the full-attention layers
read their cached KV and write nothing, the sliding-window layers rebuild theirs. With no
checkpoint left it replays from 0.

Checkpoint blocks are not referenced while no request uses them: they sit in the sliding pool's
free queue, least recently used first, and the pool evicts them (dropping every checkpoint that
shares them) when it needs room. A checkpoint also goes when the prefix-cache block at its
position is evicted, and is checked on every hit against the blocks the prefix cache matched.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import Block, CachePolicy, KVGroupSpec, PluginError, PrefixMatch, Request
from deepinfer.plugins.capabilities import SeparatesWindowedKV

NAME = "swa-replay"
_SLIDING = ("swa-replay checkpoint",)  # block_hash of sliding-pool blocks some checkpoint keeps


class SwaReplayOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replay_interval: int = Field(128, gt=0, description="tokens between checkpoints (R), a multiple of "
                                                        "block_size; a hit replays at most R tokens")
    sliding_pool_blocks: int | None = Field(
        None, ge=1, description="blocks of the sliding-window layers' pool (default: as many as the "
                                "full-attention pool; fewer gives the memory saved to that pool)")


@dataclass(slots=True)
class _Checkpoint:
    position: int
    blocks: tuple[Block, ...]  # sliding-window blocks covering the window before ``position``
    chain: list                # token_ids tuples of the prefix-cache blocks before it (shared, append-only)
    tail_id: int               # the prefix-cache block ending at ``position``


@dataclass(slots=True)
class _State:
    next_checkpoint: int = 0
    pending_replay: int = -1  # tokens this admission replays, counted once computed
    outcome: str = "restores"  # which counter the admission counts in
    chain: list = field(default_factory=list)


class SwaReplay(CachePolicy, SeparatesWindowedKV):
    """Checkpoints of sliding-window KV every R tokens; hits resume from the nearest one."""

    name = NAME
    Options = SwaReplayOptions
    requires = ("prefix-cache",)

    def __init__(self, options: SwaReplayOptions, ctx) -> None:
        super().__init__(options, ctx)
        cfg = ctx.config
        self.block_size = bs = cfg.block_size
        self.interval = r = options.replay_interval
        if r % bs:
            raise PluginError(f"option replay_interval of plugin {NAME!r} is {r}, not a multiple of block_size "
                              f"{bs}; use a positive multiple such as {max(bs, r // bs * bs)}")
        windows = [s.sliding_window for s in ctx.layers if s.sliding_window is not None]
        if not windows:
            raise PluginError(f"cache policy {NAME!r} has nothing to do: model {ctx.model_path!r} has no "
                              "sliding-window layers; drop it from plugins (prefix-cache alone is exact here)")
        names = list(cfg.plugins)
        if "prefix-cache" in names and names.index("prefix-cache") > names.index(NAME):
            raise PluginError(f"plugin {NAME!r} stacks on 'prefix-cache': list prefix-cache first "
                              f"(--plugins prefix-cache,{NAME})")
        self.window = max(windows)
        self.checkpoints: dict[tuple[int, bytes], _Checkpoint] = {}  # (c, prefix key of the block ending at c)
        self.users: dict[int, set[tuple[int, bytes]]] = {}  # sliding block id -> checkpoints using it
        self.by_full_block: dict[int, set[tuple[int, bytes]]] = {}  # prefix block id -> checkpoints ending there
        m = ctx.metrics
        m.counter("deepinfer:swa_replay_tokens", "tokens recomputed only because sliding-window state was missing")
        m.counter("deepinfer:swa_replay_restores", "prefix hits at P resumed from the nearest checkpoint, "
                                                   "floor(P / R) * R: fewer than R tokens replayed")
        m.counter("deepinfer:swa_replay_older_restores", "prefix hits whose nearest checkpoint was evicted, "
                                                         "resumed from an older one")
        m.counter("deepinfer:swa_replay_misses", "prefix hits whose checkpoints were all evicted: replayed from 0")
        m.counter("deepinfer:swa_replay_dropped_checkpoints", "checkpoints evicted or found stale")
        m.gauge("deepinfer:swa_replay_max_restore_tokens", "most tokens a restore from the nearest checkpoint replayed")
        m.gauge("deepinfer:swa_replay_checkpoints", "sliding-window checkpoints kept")
        m.gauge("deepinfer:swa_replay_kept_bytes", "bytes of sliding-window KV kept for checkpoints")
        m.gauge("deepinfer:swa_replay_kept_bytes_per_cached_token",
                "sliding-window bytes kept per token held by the prefix cache")

    def windowed_pool_blocks(self, group: KVGroupSpec, shared_blocks: int) -> int:
        return self.options.sliding_pool_blocks or shared_blocks

    def _state(self, req: Request) -> _State:
        st = req.policy_state.get(NAME)
        if st is None:
            st = req.policy_state[NAME] = _State()
        return st

    # ------------------------------------------------------------------------------------- restore
    def match(self, request: Request, previous: PrefixMatch) -> PrefixMatch:
        st = self._state(request)
        st.pending_replay, st.chain = -1, []
        st.next_checkpoint = self.interval
        p = previous.num_tokens
        if not p or previous.replay_until:
            return previous
        c = p // self.interval * self.interval
        found = None
        while c > 0 and found is None:
            found = self._usable(c, previous.blocks)
            if found is None:
                c -= self.interval
        st.pending_replay = p - c
        st.outcome = ("restores" if c == p // self.interval * self.interval
                      else "older_restores" if found is not None else "misses")
        st.next_checkpoint = c + self.interval
        if found is None:
            return PrefixMatch(previous.blocks, 0, previous.wait, (), p)
        st.chain = found.chain[:c // self.block_size]  # this request's own, appended as it goes
        return PrefixMatch(previous.blocks, c, previous.wait, found.blocks, p)

    def _usable(self, c: int, blocks: list[Block]) -> _Checkpoint | None:
        n = c // self.block_size
        ck = self.checkpoints.get((c, blocks[n - 1].block_hash))
        if ck is None:
            return None
        # the prefix cache compared each matched block's tokens with the request's; these being the
        # very blocks (and contents) the checkpoint was taken over makes the two prefixes equal
        if any(b.token_ids is not t for b, t in zip(blocks[:n], ck.chain, strict=False)):
            return None
        return ck

    # ---------------------------------------------------------------------------------- checkpoint
    def on_computed(self, request: Request, blocks: list[Block]) -> None:
        st = self._state(request)
        m = self.ctx.metrics
        if st.pending_replay >= 0:  # first step after admission
            m.inc("deepinfer:swa_replay_tokens", st.pending_replay)
            m.inc(f"deepinfer:swa_replay_{st.outcome}")
            if st.outcome == "restores":
                peak = m.gauges.get("deepinfer:swa_replay_max_restore_tokens", 0)
                m.set("deepinfer:swa_replay_max_restore_tokens", max(peak, st.pending_replay))
            st.pending_replay = -1
        while st.next_checkpoint <= request.num_computed_tokens:
            self._keep(request, st, blocks, st.next_checkpoint)
            st.next_checkpoint += self.interval
        self._update_gauges()

    def _keep(self, request: Request, st: _State, blocks: list[Block], c: int) -> None:
        bs, n = self.block_size, c // self.block_size
        if len(blocks) < n or blocks[n - 1].block_hash is None:
            return  # the prefix cache did not keep this block (another copy is cached): no checkpoint
        while len(st.chain) < n:
            tokens = blocks[len(st.chain)].token_ids
            if tokens is None:
                return
            st.chain.append(tokens)
        key = (c, blocks[n - 1].block_hash)
        old = self.checkpoints.get(key)
        if old is not None and self._usable(c, blocks) is old:
            return
        if old is not None:
            self._drop(key)
        table = self.ctx.kv.sliding_blocks_of(request)
        window = tuple(table[max(0, c - self.window + 1) // bs:n])
        if any(b is None for b in window):
            return
        self.checkpoints[key] = _Checkpoint(c, window, st.chain, blocks[n - 1].block_id)
        for b in window:
            b.block_hash = _SLIDING
            self.users.setdefault(b.block_id, set()).add(key)
        self.by_full_block.setdefault(blocks[n - 1].block_id, set()).add(key)

    def _drop(self, key: tuple[int, bytes]) -> None:
        ck = self.checkpoints.pop(key, None)
        if ck is None:
            return
        self.ctx.metrics.inc("deepinfer:swa_replay_dropped_checkpoints")
        for b in ck.blocks:
            users = self.users.get(b.block_id)
            if users is not None:
                users.discard(key)
                if not users:
                    del self.users[b.block_id]
                    b.block_hash = None
        tail = self.by_full_block.get(ck.tail_id)
        if tail is not None:
            tail.discard(key)
            if not tail:
                del self.by_full_block[ck.tail_id]

    def on_evict(self, block: Block) -> None:
        if block.block_hash is _SLIDING:
            for key in list(self.users.get(block.block_id, ())):
                self._drop(key)
        else:
            for key in list(self.by_full_block.pop(block.block_id, ())):
                self._drop(key)
        self._update_gauges()

    def on_free(self, request: Request, blocks: list[Block]) -> None:
        st = request.policy_state.get(NAME)
        if st is not None:
            st.pending_replay, st.chain = -1, []

    def _update_gauges(self) -> None:
        m, kv = self.ctx.metrics, self.ctx.kv
        kept = len(self.users) * (kv.sliding.bytes_per_block if kv is not None and kv.sliding else 0)
        cached_tokens = m.gauges.get("deepinfer:prefix_cache_cached_blocks", 0) * self.block_size
        m.set("deepinfer:swa_replay_checkpoints", len(self.checkpoints))
        m.set("deepinfer:swa_replay_kept_bytes", kept)
        m.set("deepinfer:swa_replay_kept_bytes_per_cached_token", kept / cached_tokens if cached_tokens else 0.0)
