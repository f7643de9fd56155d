"""HostCopy: the host gets the values the tensor had when the copy was queued, in line or on a
stream of its own, whatever is written into the tensor after."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.host_copy import HostCopy


@pytest.mark.parametrize("aside", [False, True])
def test_cpu_copies_are_snapshots(aside):
    src = torch.arange(5)
    copy = HostCopy(src, aside=aside)
    copy.before_overwrite()  # nothing to wait for on the CPU
    src.fill_(-1)
    assert copy.wait().tolist() == [0, 1, 2, 3, 4]


@pytest.mark.gpu
@pytest.mark.parametrize("aside", [False, True])
def test_cuda_copies_see_the_values_queued_before_them(aside):
    dev = torch.device("cuda")
    src = torch.zeros(4096, dtype=torch.long, device=dev)
    big = torch.randn(4096, 4096, device=dev)
    for step in range(20):
        big = big @ big.T / 4096  # keeps the stream busy, so the copy is queued behind work
        src.fill_(step)
        copy = HostCopy(src, aside=aside)
        copy.before_overwrite()
        src.fill_(-1)  # the next step's write, queued after the copy has been waited for
        assert bool((copy.wait() == step).all())
