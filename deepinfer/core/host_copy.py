"""Copies of device tensors to host memory that the host waits for later (a step's samples, a
draft round's tokens), and rows of a device tensor taken without waiting for it."""
from __future__ import annotations

import torch

_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


class HostCopy:
    """A device tensor's copy to host memory, queued behind the work that computes it; ``wait``
    blocks on that copy alone (on the CPU there is nothing to wait for: a snapshot, as the source
    may be a graph's output that its next replay overwrites). ``aside`` (CUDA): the copy runs on a
    stream of its own, beside the work queued after it, instead of in line with it; whoever then
    overwrites the source first calls ``before_overwrite``."""

    __slots__ = ("_aside", "_host", "_ready")

    def __init__(self, src: torch.Tensor, aside: bool = False) -> None:
        self._ready = None
        self._aside = src.device if aside and src.is_cuda else None  # the copy's device
        if src.device.type == "cpu":
            self._host = src.clone()
            return
        self._host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        if self._aside is not None:
            stream = _COPY_STREAMS.get(src.device)
            if stream is None:
                stream = _COPY_STREAMS[src.device] = torch.cuda.Stream(src.device)
            stream.wait_stream(torch.cuda.current_stream(src.device))  # the source is computed
            with torch.cuda.stream(stream):
                self._host.copy_(src, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(stream)
        else:
            self._host.copy_(src, non_blocking=True)
            self._ready = torch.Event(src.device)
            self._ready.record()

    def before_overwrite(self) -> None:
        """Queue a wait for the copy on the current stream (nothing once ``wait`` has returned, or
        for a copy in line: it is ordered before whatever is queued after it)."""
        if self._aside is not None and self._ready is not None:
            torch.cuda.current_stream(self._aside).wait_event(self._ready)

    def wait(self) -> torch.Tensor:
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        return self._host


def take_rows(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """hidden[rows] without waiting for the device: a view when the rows are consecutive (every
    request of a verification computing all its rows, or every row sampling), else a gather whose
    index goes over from pinned memory (a plain list index would wait for the step to finish
    before the host could queue what follows it)."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and rows == list(range(first, first + len(rows))):
        return hidden[first:first + len(rows)]
    index = torch.tensor(rows, dtype=torch.long, pin_memory=hidden.device.type != "cpu")
    return hidden[index.to(hidden.device, non_blocking=True)]
