"""A chained draft round's first inputs (one kernel, and the draft loop's torch version) against a
plain-Python layout of the rule: the drafts accepted while they equal the target's tokens, then the
target's token (behind the last draft when all were accepted), laid out as the loop graph reads it."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.loop_graphs import chain_inputs as torch_chain_inputs
from deepinfer_kernels import chain_inputs

K, BS, MB = 5, 4, 6


def expected(bases, best, drafts, vrows, drows, tables, q):
    """The fields as ``DraftLoopGraphs.run_padded`` lays out a round whose first step feeds each
    sequence's new tokens from its first position on (padding: base -1)."""
    s = len(bases)
    f = {"ids": [[0] * q for _ in range(s)], "pos": [[0] * q for _ in range(s)], "slots": [[-1] * q for _ in range(s)],
         "lens": [0] * s, "ctx": [0] * s, "single": [False] * s, "step_pos": [[0] * s for _ in range(K - 1)],
         "step_slots": [[-1] * s for _ in range(K - 1)], "step_lens": [[0] * s for _ in range(K - 1)]}
    for i, base in enumerate(bases):
        if base < 0:
            continue
        target, draft = [best[r] for r in vrows[i]], [drafts[r] for r in drows[i]]
        a = 0
        while a < K and draft[a] == target[a]:
            a += 1
        toks, start = ([draft[K - 1], target[K]], base + K - 1) if a == K else ([target[a]], base + a)
        for j in range(q):
            f["pos"][i][j] = start + min(j, len(toks) - 1)
            if j < len(toks):
                p = start + j
                f["ids"][i][j], f["slots"][i][j] = toks[j], tables[i][p // BS] * BS + p % BS
        f["lens"][i], f["ctx"][i], f["single"][i] = start + len(toks), start, len(toks) == 1
        for j in range(K - 1):
            p = start + len(toks) + j
            f["step_pos"][j][i], f["step_lens"][j][i], f["step_slots"][j][i] = p, p + 1, tables[i][p // BS] * BS + p % BS
    return f


@pytest.mark.parametrize("q", [2, 6])
def test_chained_inputs_follow_the_accepted_drafts(q, device):
    g = torch.Generator().manual_seed(q)
    bases = [3, 7, 10, -1, 0]  # the fourth is padding
    accepted = [0, 2, K, 1, K - 1]
    drafts = torch.randint(10, 90, (len(bases) * K,), generator=g).tolist()
    best = torch.randint(10, 90, (len(bases) * (K + 1),), generator=g).tolist()
    # rows in another order than the sequences', as a verification of requests from a round may be
    vrows = [[(len(bases) - 1 - i) * (K + 1) + j for j in range(K + 1)] for i in range(len(bases))]
    drows = [[i * K + j for j in range(K)] for i in range(len(bases))]
    for i, a in enumerate(accepted):
        for j in range(K):
            best[vrows[i][j]] = drafts[drows[i][j]] if j < a else drafts[drows[i][j]] + 1
    tables = torch.randperm(40, generator=g)[:len(bases) * MB].view(len(bases), MB).tolist()
    want = expected(bases, best, drafts, vrows, drows, tables, q)
    assert [want["lens"][i] - want["ctx"][i] for i in range(len(bases))] == [1, 1, 2, 0, 1]

    def run(fill):
        dev = torch.device(device)
        out = {"ids": torch.full((len(bases), q), 7, dtype=torch.long), "pos": torch.full((len(bases), q), 7),
               "slots": torch.full((len(bases), q), 7), "lens": torch.full((len(bases),), 7, dtype=torch.int32),
               "ctx": torch.full((len(bases),), 7, dtype=torch.int32), "single": torch.ones(len(bases), dtype=torch.bool),
               "step_pos": torch.full((K - 1, len(bases)), 7), "step_slots": torch.full((K - 1, len(bases)), 7),
               "step_lens": torch.full((K - 1, len(bases)), 7, dtype=torch.int32)}
        out = {name: t.to(dev) for name, t in out.items()}
        fill(torch.tensor(bases, device=dev), torch.tensor(vrows, device=dev), torch.tensor(drows, device=dev),
             torch.tensor(best, device=dev), torch.tensor(drafts, device=dev),
             torch.tensor(tables, dtype=torch.int32, device=dev), BS, out)
        return {name: t.tolist() for name, t in out.items()}

    assert run(torch_chain_inputs) == want
    assert run(chain_inputs) == want


def test_chained_inputs_refuse_shapes_that_do_not_fit(device):
    z = torch.zeros(2, dtype=torch.long, device=device)
    out = {"ids": torch.zeros(2, 2, dtype=torch.long, device=device), "step_pos": torch.zeros(3, 2, device=device)}
    with pytest.raises(ValueError, match="k - 1 later steps"):
        chain_inputs(z, torch.zeros(2, K + 1, dtype=torch.long, device=device),
                     torch.zeros(2, K, dtype=torch.long, device=device), z, z,
                     torch.zeros(2, MB, dtype=torch.int32, device=device), BS, out)
