"""The MoE alignment (slots sorted by expert, padded to blocks) against a loop over experts on the host,
by both of its paths: one program (small steps) and three launches (large steps; forced here with
``one_program_chunks=0``). Both run in the interpreter: ``slow``."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import moe_align, moe_align_ref
from deepinfer_kernels.moe_align import max_blocks

pytestmark = pytest.mark.slow
#: the most chunks one program takes, per path
PATHS = [pytest.param(10**6, id="one_program"), pytest.param(0, id="three_launches")]


def _routes(t, k, e, seed=0, experts=None):
    """topk_ids [t, k] int32: k distinct experts a token, drawn from ``experts`` (default all e)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor(experts if experts is not None else range(e))
    return torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(t)]).to(torch.int32)


@pytest.mark.parametrize(("t", "k", "e", "block_m", "experts"), [
    (1, 2, 8, 16, None),            # batch 1: one block per chosen expert
    (13, 2, 8, 16, None),           # slots not a multiple of the block
    (20, 3, 8, 4, None),            # several blocks per expert
    (9, 1, 8, 16, None),            # top-1
    (17, 2, 8, 8, [1, 2, 5]),       # most experts receive nothing
    (40, 4, 64, 16, None),          # more experts than blocks can be filled
    (70, 2, 16, 4, None),           # two chunks of 128 slots
    (300, 2, 64, 16, None),         # three chunks of 128 slots
    (136, 4, 256, 16, None),        # DeepSeek-V3's 256 experts: 17 chunks of 32 slots, added up 16 at a time
])
@pytest.mark.parametrize("one_program_chunks", PATHS)
def test_alignment_matches_a_loop_over_experts(t, k, e, block_m, experts, one_program_chunks, device):
    ids = _routes(t, k, e, experts=experts).to(device)
    got, want = moe_align(ids, e, block_m, one_program_chunks), moe_align_ref(ids, e, block_m)
    assert torch.equal(got.sorted_ids, want.sorted_ids)
    assert torch.equal(got.block_experts, want.block_experts)
    assert got.sorted_ids.dtype == got.block_experts.dtype == torch.int32


@pytest.mark.parametrize("one_program_chunks", PATHS)
def test_every_slot_lands_once_in_a_block_of_its_expert(one_program_chunks, device):
    """The counted invariant, independent of the reference: each slot t * K + k appears exactly once,
    in a block labelled with topk_ids[t, k]; every other entry is the padding value T * K."""
    t, k, e, bm = 23, 3, 8, 4
    ids = _routes(t, k, e, seed=3)
    got = moe_align(ids.to(device), e, bm, one_program_chunks)
    entries = got.sorted_ids.long().cpu()
    real = entries < t * k
    assert sorted(entries[real].tolist()) == list(range(t * k))
    block_of = torch.arange(entries.numel()) // bm
    assert torch.equal(got.block_experts.long().cpu()[block_of[real]], ids.reshape(-1).long()[entries[real]])
    assert bool((entries[~real] == t * k).all())


@pytest.mark.parametrize("one_program_chunks", PATHS)
def test_batch_one_needs_only_its_k_experts_blocks(one_program_chunks, device):
    """At batch 1 the grid is sized for K blocks (no program for an expert without tokens)."""
    ids = torch.tensor([[5, 2, 7]], dtype=torch.int32, device=device)
    got = moe_align(ids, 64, 16, one_program_chunks)
    assert max_blocks(3, 64, 16) == 3
    assert got.block_experts.tolist() == [2, 5, 7]
    assert got.sorted_ids.view(3, 16)[:, 0].tolist() == [1, 0, 2]


@pytest.mark.parametrize("one_program_chunks", PATHS)
def test_ids_outside_the_experts_get_no_block(one_program_chunks, device):
    ids = torch.tensor([[0, 8], [-1, 3], [3, 0]], dtype=torch.int32, device=device)
    got = moe_align(ids, 8, 4, one_program_chunks)
    kept = got.sorted_ids[got.sorted_ids < 6].tolist()
    assert sorted(kept) == [0, 3, 4, 5]  # slots 1 (id 8) and 2 (id -1) are left out
    assert got.block_experts.tolist()[:2] == [0, 3] and set(got.block_experts.tolist()[2:]) <= {-1}
