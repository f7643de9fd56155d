"""The static inputs of a set of device graphs, packed in one buffer per set (see ``PackedInputs``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from deepinfer.core.fused_ops import FusedOps


class PackedInputs:
    """The static inputs of a set of graphs in one device buffer, refilled from a pinned host
    buffer by one copy a step. Each batch size lays the fields out back to back for that size
    (field name -> dtype and shape for a batch size), so a step copies its size's bytes and no
    more; the layouts share the buffer (one replay at a time). ``sets`` host buffers are used in
    turn: a step's copy may still be queued behind the step before it while the next is filled.
    Staged sizes (``staged``) are not copied: their replays read them from host memory."""

    def __init__(self, fields: dict[str, tuple[torch.dtype, Callable[[int], tuple[int, ...]]]],
                 sizes: Sequence[int], device: torch.device, pin: bool, sets: int = 2,
                 staged_bytes: int = 0) -> None:
        """``staged_bytes``: sizes whose layout takes at most this many bytes are staged: their
        replays read the fields from host memory themselves (``stage_inputs``, see ``stage``)."""
        self.layouts: dict[int, tuple[dict[str, tuple[int, torch.dtype, tuple[int, ...]]], int]] = {}
        for b in sizes:
            at, fields_b = 0, {}
            for name, (dtype, shape) in fields.items():
                shp = tuple(shape(b))
                fields_b[name] = (at, dtype, shp)
                at += -(-int(np.prod(shp)) * dtype.itemsize // 16) * 16  # 16-byte aligned fields
            self.layouts[b] = (fields_b, at)
        total = max(n for _, n in self.layouts.values())
        self.device_buffer = torch.zeros(total, dtype=torch.uint8, device=device)
        self.host_buffers = [torch.zeros(total, dtype=torch.uint8, pin_memory=pin) for _ in range(sets)]
        # the views, made once (a step's host work is on the critical path at small batches)
        self._device = {b: self._views(self.device_buffer, b) for b in sizes}
        self._host = [{b: {k: v.numpy() for k, v in self._views(h, b).items()} for b in sizes}
                      for h in self.host_buffers]
        #: staged sizes: two turns of their layouts in one host buffer [2, bytes] that the device
        #: reads; each replay reads the turn ``stage_turn`` names and flips it, and the host fills
        #: the turn its own count of replays names (so a replay still queued keeps its turn)
        self.staged = {b for b in sizes if self.layouts[b][1] <= staged_bytes and self.layouts[b][0]["ids"][0] == 0}
        width = max([16] + [self.layouts[b][1] for b in self.staged])
        self.stage_host = torch.zeros(2, width, dtype=torch.uint8, pin_memory=pin and bool(self.staged))
        self.stage_turn = torch.zeros(1, dtype=torch.int32, device=device)
        self._stage_parity = 0
        self._staged_views = [{b: {k: v.numpy() for k, v in self._views(self.stage_host[t], b).items()}
                               for b in self.staged} for t in range(2)]

    def _views(self, buf: torch.Tensor, b: int) -> dict[str, torch.Tensor]:
        return {name: buf[at:at + int(np.prod(shp)) * dtype.itemsize].view(dtype).view(shp)
                for name, (at, dtype, shp) in self.layouts[b][0].items()}

    def device(self, b: int) -> dict[str, torch.Tensor]:
        """Size b's fields in the device buffer (what its graph reads)."""
        return self._device[b]

    def host(self, turn: int, b: int) -> dict[str, np.ndarray]:
        """Size b's fields in host buffer ``turn``, as arrays to fill."""
        return self._host[turn][b]

    def upload(self, turn: int, b: int) -> None:
        n = self.layouts[b][1]
        self.device_buffer[:n].copy_(self.host_buffers[turn][:n], non_blocking=True)

    def staged_host(self, b: int) -> dict[str, np.ndarray]:
        """Staged size b's fields in the turn the next replay reads, as arrays to fill."""
        return self._staged_views[self._stage_parity][b]

    def stage(self, b: int, values: torch.Tensor, ops: FusedOps) -> None:
        """Staged size b's fields into the device buffer, in one kernel: what a replay runs first
        (placeholder ids resolved from ``values`` on the way)."""
        ops.stage_inputs(self.stage_host, self.stage_turn, self.device_buffer[:self.layouts[b][1]],
                         int(np.prod(self.layouts[b][0]["ids"][2])), values)

    def staged_replay(self) -> None:
        """Count a replay of a staged size (its kernel flips the device's turn)."""
        self._stage_parity ^= 1

    def reset_turn(self) -> None:
        """Both counts back to turn 0 (after captures, whose warm-ups ran the staging)."""
        self.stage_turn.zero_()
        self._stage_parity = 0

    def blank(self, b: int) -> None:
        """Size b's device fields, and its staged host fields, as padding (length 0, slot -1)."""
        for views in [self._device[b]] + [v[b] for v in self._staged_views if b in v]:
            for name, t in views.items():
                t[...] = -1 if "slots" in name else 0
