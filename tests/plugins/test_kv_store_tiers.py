"""kv-store's tiers under a test clock: block files checked on read, TTL per retention class, byte
caps with least-recently-used eviction, a crash's leftovers; and KVBlocks' bytes round trip."""
from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from deepinfer.core.kv_blocks import KVBlocks
from deepinfer_builtin.cache.kv_store.blockfile import CorruptBlock, decode, encode
from deepinfer_builtin.cache.kv_store.tiers import DirTier, HostTier

DAY = 86400.0
TTLS = {"agent": 3 * DAY, "chat": 7 * DAY}
TOKS = (5, 6, 7, 8)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def _payload(i: int, n: int = 100) -> memoryview:
    return memoryview(torch.full((n,), i % 256, dtype=torch.uint8).numpy())


def _disk(tmp_path, clock, cap=1 << 20) -> tuple[DirTier, Counter]:
    stats: Counter = Counter()
    return DirTier(str(tmp_path), cap, TTLS, clock, lambda k, n: stats.update({k: n}), fsync=False), stats


def test_block_file_round_trips_and_rejects_every_damage():
    data = encode(_key(1), TOKS, _payload(3))
    toks, payload = decode(data, _key(1), TOKS)
    assert toks == TOKS and bytes(payload) == bytes(_payload(3))
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad in (data[:-1], data[:20], data + b"\0", bytes(flipped)):
        with pytest.raises(CorruptBlock):
            decode(bad, _key(1), TOKS)
    with pytest.raises(CorruptBlock):
        decode(data, _key(2), TOKS)  # another key's file
    with pytest.raises(CorruptBlock):
        decode(data, _key(1), (5, 6, 7, 9))  # same key, other tokens: a collision is never served


def test_corrupt_file_is_removed_and_counted_never_served(tmp_path):
    clock = Clock()
    disk, stats = _disk(tmp_path, clock)
    disk.put(_key(1), TOKS, _payload(1), "chat")
    path = disk.path(_key(1), "chat")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    assert disk.get(_key(1), TOKS) is None
    assert stats["disk_corrupt"] == 1 and not os.path.exists(path) and _key(1) not in disk


def test_ttl_per_retention_class_counts_from_last_use(tmp_path):
    clock = Clock()
    disk, stats = _disk(tmp_path, clock)
    disk.put(_key(1), TOKS, _payload(1), "agent")
    disk.put(_key(2), TOKS, _payload(2), "chat")
    clock.now += 2 * DAY
    assert disk.get(_key(1), TOKS) is not None  # a use: its 3 days start again
    clock.now += 2.5 * DAY
    assert disk.get(_key(1), TOKS) is not None and disk.get(_key(2), TOKS) is not None
    clock.now += 3.5 * DAY  # 3.5 days since the agent block's last use, 3.5 since the chat one's
    assert disk.get(_key(1), TOKS) is None
    assert disk.get(_key(2), TOKS) is not None
    assert not os.path.exists(disk.path(_key(1), "agent")) and stats["disk_evictions"] == 1


def test_retention_survives_a_restart(tmp_path):
    clock = Clock()
    disk, _ = _disk(tmp_path, clock)
    disk.put(_key(1), TOKS, _payload(1), "agent")
    disk.put(_key(2), TOKS, _payload(2), "chat")
    clock.now += 4 * DAY
    again, _ = _disk(tmp_path, clock)  # a new process: the ledger comes from the files
    assert again.get(_key(1), TOKS) is None and again.get(_key(2), TOKS) is not None


def test_size_cap_evicts_expired_first_then_least_recently_used(tmp_path):
    clock = Clock()
    size = len(encode(_key(0), TOKS, _payload(0)))
    disk, stats = _disk(tmp_path, clock, cap=3 * size)
    for i, retention in ((1, "chat"), (2, "chat"), (3, "agent")):
        disk.put(_key(i), TOKS, _payload(i), retention)
        clock.now += 1
    disk.get(_key(1), TOKS)  # least recent first: 2, 3, 1
    disk.put(_key(4), TOKS, _payload(4), "chat")  # over the cap, nothing expired: 2 goes
    assert [_key(i) in disk for i in (1, 2, 3, 4)] == [True, False, True, True]
    clock.now += 1
    disk.get(_key(3), TOKS)  # least recent first: 1, 4, 3
    clock.now += 3 * DAY + 1  # the agent block 3 has expired; the chat blocks 1 and 4 have not
    disk.put(_key(5), TOKS, _payload(5), "chat")  # over the cap: the expired 3 goes, not the least recent 1
    assert [_key(i) in disk for i in (1, 3, 4, 5)] == [True, False, True, True]
    assert disk.ledger.total == 3 * size and stats["disk_evictions"] == 2
    assert sum(len(files) for _, _, files in os.walk(tmp_path)) == 3


def test_host_tier_cap_and_ttl():
    clock = Clock()
    stats: Counter = Counter()
    host = HostTier(250, TTLS, clock, lambda k, n: stats.update({k: n}))
    for i in range(3):
        host.put(_key(i), TOKS, torch.full((100,), i, dtype=torch.uint8), "chat")
        clock.now += 1
    assert [_key(i) in host for i in range(3)] == [False, True, True]
    assert host.get(_key(1), (1, 2, 3, 4)) is None  # same key, other tokens: a miss
    assert int(host.get(_key(2), TOKS)[0]) == 2
    clock.now += 8 * DAY
    assert host.get(_key(2), TOKS) is None and stats["host_evictions"] == 2


def test_crashed_write_leftovers_are_removed_at_start(tmp_path):
    clock = Clock()
    disk, _ = _disk(tmp_path, clock)
    disk.put(_key(1), TOKS, _payload(1), "chat")
    leftover = disk.path(_key(2), "chat") + ".123.abcd.tmp"
    os.makedirs(os.path.dirname(leftover), exist_ok=True)
    with open(leftover, "wb") as f:
        f.write(b"half a block")
    again, _ = _disk(tmp_path, clock)
    assert not os.path.exists(leftover) and _key(2) not in again and again.get(_key(1), TOKS) is not None


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("apart", [False, True], ids=["one-tensor", "rows-apart"])
@pytest.mark.parametrize("layout", ["slots", "blocks", "latent"])
def test_kv_blocks_round_trip_bit_for_bit(layout, apart, device):
    nb, bs = 6, 4
    shapes = {"slots": (2, nb * bs, 2, 8), "blocks": (2, nb, bs, 2, 8), "latent": (nb * bs, 1, 12)}
    caches = [torch.randn(*shapes[layout], device=device), torch.randn(*shapes[layout], device=device).half()]
    kv = KVBlocks.of(caches, nb, bs, torch.device(device))
    rows, ready = kv.read([4, 1])
    ready()
    assert rows.device.type == "cpu"
    before = [c.clone() for c in caches]
    # (rows apart: each its own host tensor, pinned on a GPU machine, as a KV store's host tier keeps them)
    kv.write([0, 5], [r.clone().pin_memory() if device == "cuda" else r.clone() for r in rows] if apart else rows)
    for c, b in zip(caches, before, strict=True):
        view = c.view(*c.shape[:-3], nb, bs, *c.shape[-2:]) if layout != "blocks" else c
        ref = b.view_as(view)
        d = view.dim() - 4
        assert torch.equal(view.select(d, 0), ref.select(d, 4)) and torch.equal(view.select(d, 5), ref.select(d, 1))
        assert torch.equal(view.select(d, 2), ref.select(d, 2))  # untouched blocks unchanged
    assert KVBlocks.of([torch.zeros(3, 5)], nb, bs, torch.device("cpu")) is None
