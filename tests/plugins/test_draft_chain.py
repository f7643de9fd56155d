"""A draft round chained behind a verification (DraftRunner.chain) is taken by the next proposal
only if each request holds exactly its tokens before the verification plus what the verification
gave; the draft sequence then records what the chained round's first step fed. Otherwise it is
dropped and the draft sequence is left as it was."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepinfer.core.host_copy import HostCopy
from deepinfer.core.loop_graphs import LoopRound
from deepinfer_builtin.drafters.draft_model.rounds import ChainedRound
from deepinfer_builtin.drafters.draft_model.runner import DraftRunner
from deepinfer_builtin.drafters.draft_model.seq import DraftSeq

K = 3


def _round(tokens: list[list[int]]) -> LoopRound:
    out = torch.tensor([[row, [0.5] * K] for row in tokens], dtype=torch.float32)  # [n, 2, k]
    return LoopRound(out, lazy=True)


def _setup(best: list[int]):
    """One request of 4 tokens whose last round drafted 5, 6, 7 (its draft's cache holds the 4 and
    the drafts but the last); ``best``: the target's k + 1 tokens at the verification."""
    runner = DraftRunner.__new__(DraftRunner)
    prev, new = _round([[5, 6, 7]]), _round([[11, 12, 13]])
    seq = DraftSeq(tokens=[1, 2, 3, 4], committed=4, pending=(prev, 0))
    runner.seqs = {"a": seq}
    chained = ChainedRound(new, prev, HostCopy(torch.tensor(best)), {"a": (0, seq, 4, 0, 0)})
    return runner, seq, prev, new, chained


def _request(rid: str, tokens: list[int]):
    return SimpleNamespace(request_id=rid, all_token_ids=tokens, params=SimpleNamespace(greedy=True))


@pytest.mark.parametrize("best", [[5, 6, 9, 0], [5, 6, 7, 8], [9, 0, 0, 0]])  # 2, all and none accepted
def test_a_chained_round_is_taken_when_the_tokens_are_what_the_verification_gave(best):
    runner, seq, _, new, chained = _setup(best)
    a = next((i for i in range(K) if best[i] != [5, 6, 7][i]), K)
    tokens = [1, 2, 3, 4] + [5, 6, 7][:a] + [best[a]]
    drafts = runner._take_chained(chained, [_request("a", tokens)], K, lazy=True)
    assert drafts["a"].tokens == [-1, -2, -3] and drafts["a"].source is new.source
    # the draft's cache now holds the request's tokens (the chained round's first step fed those
    # after the accepted drafts), its drafts pending from the chained round
    assert seq.tokens == tokens and seq.pending == (new, 0) and seq.committed == len(tokens)


def test_a_chained_round_is_dropped_otherwise():
    runner, seq, prev, _, chained = _setup([5, 6, 9, 0])
    # the request took another round since (a lookup's): more tokens than the verification gave
    assert runner._take_chained(chained, [_request("a", [1, 2, 3, 4, 5, 6, 9, 3])], K, lazy=True) is None
    # a request the chained round does not hold
    assert runner._take_chained(chained, [_request("a", [1, 2, 3, 4, 5, 6, 9]), _request("b", [1, 2])], K,
                                lazy=True) is None
    # a token other than the verification's
    assert runner._take_chained(chained, [_request("a", [1, 2, 3, 4, 5, 6, 8])], K, lazy=True) is None
    assert seq.tokens == [1, 2, 3, 4] and seq.pending == (prev, 0) and seq.committed == 4  # left as it was
    # its sequence released (the request finished or was preempted), then made again
    runner.seqs["a"] = DraftSeq(tokens=[1, 2, 3, 4], committed=4, pending=(prev, 0))
    assert runner._take_chained(chained, [_request("a", [1, 2, 3, 4, 5, 6, 9])], K, lazy=True) is None
