"""The error a tensor-parallel engine ends with (importable without torch: the server's API process
tells it apart)."""
from __future__ import annotations


class WorkerError(RuntimeError):
    """A rank of a tensor-parallel engine failed (or the ranks were stopped): the engine cannot run on."""
