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


@pytest.mark.parametrize(("n_ids", "n_bytes"), [(1, 2112), (12, 4096), (3, 32768)])
def test_stage_inputs_copies_the_named_turn_resolves_the_ids_and_flips_the_turn(n_ids, n_bytes, device):
    from deepinfer_kernels import stage_inputs, stage_inputs_ref

    g = torch.Generator().manual_seed(n_bytes)
    # host memory the device reads: pinned where there is a GPU
    src = torch.randint(0, 256, (2, n_bytes + 64), dtype=torch.uint8, generator=g).pin_memory() if device == "cuda" \
        else torch.randint(0, 256, (2, n_bytes + 64), dtype=torch.uint8, generator=g)
    values = torch.randint(0, 50_000, (5,), generator=g).to(device)
    for t in (0, 1):
        ids = torch.randint(0, 50_000, (n_ids,), generator=g)
        ids[::2] = -torch.randint(1, 6, (len(ids[::2]),), generator=g)  # -(r+1), r in 0..4
        src[t, :8 * n_ids].view(torch.int64).copy_(ids)
    for t in (1, 0, 1):
        turn = torch.tensor([t], dtype=torch.int32, device=device)
        want_turn = turn.clone()
        dst = torch.zeros(n_bytes, dtype=torch.uint8, device=device)
        want = stage_inputs_ref(src, want_turn, dst.clone(), n_ids, values)
        assert stage_inputs(src, turn, dst, n_ids, values) is dst
        assert torch.equal(dst, want) and turn.tolist() == want_turn.tolist() == [1 - t]
        assert dst[8 * n_ids:].tolist() == src[t, 8 * n_ids:n_bytes].tolist()  # the rest as it was
        got_ids = dst[:8 * n_ids].view(torch.int64)
        assert bool((got_ids >= 0).all()) and set(got_ids[::2].tolist()) <= set(values.tolist())


def test_stage_inputs_without_values_and_bad_input(device):
    from deepinfer_kernels import stage_inputs

    src = torch.zeros(2, 64, dtype=torch.uint8)
    src[1, :8].view(torch.int64)[0] = 42
    turn = torch.ones(1, dtype=torch.int32, device=device)
    none = torch.empty(0, dtype=torch.long, device=device)
    if device == "cuda":
        src = src.pin_memory()
    dst = torch.full((32,), 9, dtype=torch.uint8, device=device)
    stage_inputs(src, turn, dst, 1, none)
    assert dst[:8].view(torch.int64).tolist() == [42] and dst[8:].tolist() == [0] * 24 and turn.tolist() == [0]
    with pytest.raises(ValueError, match="n <= N and n <= 32768"):
        stage_inputs(src, turn, torch.zeros(72, dtype=torch.uint8, device=device), 1, none)
    with pytest.raises(ValueError, match="holding 5 int64 ids first"):
        stage_inputs(src, turn, dst, 5, none)
    with pytest.raises(ValueError, match="turn must be int32"):
        stage_inputs(src, turn.long(), dst, 1, none)
