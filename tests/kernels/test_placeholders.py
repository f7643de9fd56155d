"""Placeholder tokens resolved in one launch, against the torch reference (and the engine's own
five-kernel version)."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.graphs import resolve_placeholders as engine_resolve
from deepinfer_kernels import resolve_placeholders, resolve_placeholders_ref


@pytest.mark.parametrize("n", [1, 7, 1500])  # 1500: two programs, the second ragged
def test_placeholders_take_their_values_and_tokens_stay(n, device):
    g = torch.Generator().manual_seed(n)
    values = torch.randint(0, 50_000, (9,), generator=g)
    ids = torch.randint(0, 50_000, (n,), generator=g)
    held = torch.rand(n, generator=g) < 0.4
    ids[held] = -torch.randint(1, 10, (int(held.sum()),), generator=g)  # -(r+1), r in 0..8
    ids[0] = 0  # token 0 is a token, not a placeholder
    ids, values = ids.to(device), values.to(device)
    want = resolve_placeholders_ref(ids, values)
    assert torch.equal(want, engine_resolve(ids, values))
    got = resolve_placeholders(ids, values)
    assert torch.equal(got, want) and got.data_ptr() != ids.data_ptr()
    assert int(got[0]) == 0 and bool((got >= 0).all())
    same = ids.clone()
    assert resolve_placeholders(same, values, out=same) is same and torch.equal(same, want)  # in place


def test_no_placeholders_no_values_and_bad_input(device):
    ids = torch.tensor([5, 0, 7], device=device)
    none = torch.empty(0, dtype=torch.long, device=device)
    assert resolve_placeholders(ids, none).tolist() == [5, 0, 7]
    # a placeholder past the values (the engine refuses it before this): 0, as the reference
    stray = torch.tensor([-1, 4, -3], device=device)
    two = torch.tensor([8, 9], device=device)
    assert resolve_placeholders(stray, two).tolist() == resolve_placeholders_ref(stray, two).tolist() == [8, 4, 0]
    assert resolve_placeholders(stray, none).tolist() == resolve_placeholders_ref(stray, none).tolist() == [0, 4, 0]
    assert resolve_placeholders(ids[:0], ids).numel() == 0
    with pytest.raises(ValueError, match="contiguous 1-D int64 ids and values on one device"):
        resolve_placeholders(ids.to(torch.int32), ids)
    with pytest.raises(ValueError, match="out must be a contiguous int64"):
        resolve_placeholders(ids, ids, out=torch.empty(2, dtype=torch.long, device=device))
