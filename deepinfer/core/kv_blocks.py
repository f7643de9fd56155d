"""Whole KV blocks copied out of the device cache and back, for a cache policy that keeps blocks
beyond device memory (a KV store). It moves bytes; it never interprets them."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def _block_view(cache: Any, num_blocks: int, block_size: int) -> tuple[torch.Tensor, int] | None:
    """One layer's cache as a view whose dim ``d`` indexes blocks: a dim of ``num_blocks`` followed
    by one of ``block_size`` (blocks kept apart), or one of ``num_blocks * block_size`` slots (slot
    s is token s % block_size of block s // block_size), split in two. None for any other layout."""
    if not isinstance(cache, torch.Tensor):
        return None
    shape = tuple(cache.shape)
    for d in range(len(shape) - 1):
        if shape[d] == num_blocks and shape[d + 1] == block_size:
            return cache, d
    for d, n in enumerate(shape):
        if n == num_blocks * block_size:
            return cache.view(*shape[:d], num_blocks, block_size, *shape[d + 1:]), d
    return None


class KVBlocks:
    """Reads and writes the contents of whole blocks of the full-attention pool (KV group 0) across
    every layer, as one row of bytes a block; rows go to host memory and come back bit for bit."""

    def __init__(self, views: list[tuple[torch.Tensor, int]], device: torch.device) -> None:
        self._views = views
        self.device = device
        self._sizes = [v.select(d, 0).numel() * v.element_size() for v, d in views]
        self.bytes_per_block = sum(self._sizes)
        #: what the bytes mean: each layer's per-block shape and dtype (part of a store's address)
        self.layout = ";".join(f"{tuple(v.select(d, 0).shape)}:{v.dtype}" for v, d in views)

    @classmethod
    def of(cls, caches: Sequence[Any], num_blocks: int, block_size: int,
           device: torch.device) -> KVBlocks | None:
        """Over the given layers' caches, or None where a layout has no block dimension to find."""
        views = [_block_view(c, num_blocks, block_size) for c in caches]
        if not views or any(v is None for v in views):
            return None
        return cls(views, device)

    def _ids(self, block_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        if self.device.type == "cpu":
            return ids
        return ids.pin_memory().to(self.device, non_blocking=True)  # (a pageable copy would wait for the step)

    def read(self, block_ids: Sequence[int]) -> tuple[torch.Tensor, Callable[[], None]]:
        """The blocks' bytes as a host tensor [n, bytes_per_block] uint8, and a call that waits until
        the copy is done (queued behind the device's work, so a step still running is written first)."""
        ids = self._ids(block_ids)
        on_host = self.device.type == "cpu"
        gathered = torch.empty(len(block_ids), self.bytes_per_block, dtype=torch.uint8, device=self.device)
        col = 0
        for (view, d), size in zip(self._views, self._sizes, strict=True):
            rows = view.index_select(d, ids).movedim(d, 0).contiguous()
            gathered[:, col:col + size] = rows.view(len(block_ids), -1).view(torch.uint8)
            col += size
        if on_host:
            return gathered, lambda: None
        out = torch.empty(gathered.shape, dtype=torch.uint8, pin_memory=True)
        out.copy_(gathered, non_blocking=True)  # one copy, queued behind the step
        event = torch.Event(device=self.device)
        event.record()
        return out, event.synchronize

    def write(self, block_ids: Sequence[int], rows: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Put ``rows`` ([n, bytes_per_block] uint8, as ``read`` gave them, or n such rows apart) into
        the blocks, queued on the device before any later step. Rows apart each go to the device in
        a copy of their own, which waits for nothing where they are in pinned memory (a KV store's
        host tier keeps them so): no gathering on the host first."""
        ids = self._ids(block_ids)
        if self.device.type == "cpu":
            rows = rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows))
        else:
            staged = torch.empty(len(block_ids), self.bytes_per_block, dtype=torch.uint8, device=self.device)
            if isinstance(rows, torch.Tensor):
                staged.copy_(rows, non_blocking=rows.is_pinned())
            else:
                for i, row in enumerate(rows):
                    staged[i].copy_(row, non_blocking=row.is_pinned())
            rows = staged
        col = 0
        for (view, d), size in zip(self._views, self._sizes, strict=True):
            part = rows[:, col:col + size].contiguous().view(view.dtype)
            shape = view.select(d, 0).shape
            view.index_copy_(d, ids, part.view(len(block_ids), *shape).movedim(0, d))
            col += size
