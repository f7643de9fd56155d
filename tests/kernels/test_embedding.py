"""Token embedding against torch's embedding: any ids, tables wider than one program's block."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import embedding, embedding_ref, pdl_supported
from tests.kernels.paged import DTYPES, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [24, 5000])  # 5,000: two programs a token, the second ragged
def test_embedding_matches_torch(dtype, hidden, device):
    table = randn(37, hidden, dtype=dtype, device=device)
    for ids in ([3], [0, 36, 3, 3], list(range(37))):
        for idt in (torch.int64, torch.int32):
            x = torch.tensor(ids, dtype=idt, device=device)
            got = embedding(x, table)
            assert got.dtype == dtype and got.shape == (len(ids), hidden)
            assert torch.equal(got, embedding_ref(x.long(), table))  # a copy: the same bits


def test_embedding_of_a_table_view_and_no_ids(device):
    wide = randn(10, 64, dtype=torch.float32, device=device)
    table = wide[:, 16:48]  # rows of a view: a row stride other than the width
    x = torch.tensor([9, 1], device=device)
    assert torch.equal(embedding(x, table), embedding_ref(x, table))
    assert embedding(x[:0], table).shape == (0, 32)
    ids = torch.tensor([4, 0, 7, 1, 2], device=device)[::2]  # strided ids
    assert torch.equal(embedding(ids, table), embedding_ref(ids, table))


def test_embedding_rejects_bad_inputs(device):
    table = randn(10, 8, dtype=torch.float32, device=device)
    for ids, t in ((torch.tensor([[1]], device=device), table), (torch.tensor([1.0], device=device), table),
                   (torch.tensor([1], device=device), table.t())):
        with pytest.raises(ValueError, match="embedding takes 1-D int32/int64 ids and a table"):
            embedding(ids, t)


@pytest.mark.gpu
def test_programmatic_launch_gives_the_same_rows(device):
    if not pdl_supported(torch.device(device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ and Triton 3.4+")
    table = randn(1000, 2048, dtype=torch.bfloat16, device=device)
    x = torch.tensor([999, 0, 17], device=device)
    assert torch.equal(embedding(x, table, pdl=True), embedding_ref(x, table))
