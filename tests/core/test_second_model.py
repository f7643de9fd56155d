"""SecondModel, the core's runner of a drafter's second model: its steps give the model's logits
(transformers is the oracle), a sequence fed in parts gives what it gives whole, its rows are drawn
as the sampler draws them, and its pool gets every block back."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.core.request import Request
from deepinfer.core.second_model import SecondModel

PROMPT = [5, 9, 17, 33, 2, 71, 8, 64, 100, 12, 3]


@pytest.fixture(scope="module")
def second(tiny_llama):
    """The tiny Llama loaded as the second model of an engine that runs it as its target too."""
    path, hf = tiny_llama
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=4, progress=False)
    return SecondModel(llm.engine.ctx, str(path), num_blocks=16), hf


def _hf_last_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def test_a_step_gives_the_models_logits_and_their_argmax(second):
    model, hf = second
    blocks = []
    assert model.reserve(blocks, len(PROMPT))
    logits, best_p, best = model.step([(PROMPT, 0, [b.block_id for b in blocks])])
    want = _hf_last_logits(hf, PROMPT)
    torch.testing.assert_close(logits[0], want, rtol=1e-4, atol=1e-4)
    assert int(best[0]) == int(want.argmax())
    torch.testing.assert_close(best_p[0], want.softmax(-1).max(), rtol=1e-4, atol=1e-5)
    model.free(blocks)
    model.pool.check_all_free()


def test_a_sequence_fed_in_parts_gives_what_it_gives_whole(second):
    """The KV of the first part stays in the model's pool: the later feeds compute only their tokens."""
    model, hf = second
    blocks = []
    assert model.reserve(blocks, len(PROMPT) + 2)
    table = [b.block_id for b in blocks]
    model.step([(PROMPT[:6], 0, table)], argmax=False)
    logits, _, best = model.step([(PROMPT[6:], 6, table)])
    torch.testing.assert_close(logits[0], _hf_last_logits(hf, PROMPT), rtol=1e-4, atol=1e-4)
    nxt = int(best[0])
    logits, _, _ = model.step([([nxt], len(PROMPT), table)])
    torch.testing.assert_close(logits[0], _hf_last_logits(hf, PROMPT + [nxt]), rtol=1e-4, atol=1e-4)
    model.free(blocks)
    model.pool.check_all_free()


def test_sampled_rows_are_drawn_from_their_requests_distributions(second):
    """One uniform number of each row's generator: the same generator seed draws the same token, and
    the distribution returned is the row's softmax under its temperature (no filter here)."""
    model, _ = second
    logits = torch.randn(2, model.vocab_size, generator=torch.Generator().manual_seed(0))
    reqs = [Request(str(i), [1], SamplingParams(temperature=t, seed=3)) for i, t in enumerate((0.7, 1.3))]
    draw = [model.sample(logits, reqs, [torch.Generator().manual_seed(s) for s in (4, 5)]) for _ in range(2)]
    (tokens, q), (again, _) = draw
    assert tokens.tolist() == again.tolist()
    for i, t in enumerate((0.7, 1.3)):
        torch.testing.assert_close(q[i], (logits[i] / t).softmax(-1), rtol=1e-5, atol=1e-6)
        assert q[i, tokens[i]] > 0


def test_reserve_takes_no_block_when_the_pool_is_short(second):
    model, _ = second
    blocks = []
    assert not model.reserve(blocks, 17 * model.block_size)  # (16 blocks in all)
    assert blocks == [] and model.pool.num_free_blocks == 16
    assert model.reserve(blocks, 5) and len(blocks) == 2
    assert model.reserve(blocks, 8) and len(blocks) == 2  # (already held)
    model.free(blocks)
    model.pool.check_all_free()


def test_without_graphs_no_loop_round_is_run(second):
    model, _ = second
    assert model.loop_steps == 0 and model.loop_size(1, len(PROMPT), 3) is None
    assert model.run_loop([(PROMPT, 0, [0, 1, 2])], 3) is None
