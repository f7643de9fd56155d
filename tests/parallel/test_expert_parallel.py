"""Expert parallelism with data-parallel attention (gloo, on the CPU): the routed experts sharded over
2 and 4 ranks, each rank running its own requests, give the single-process engine's greedy tokens
(the oracle) and its expert load counts."""
from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # each case spawns its ranks (seconds each on 2 cores)

#: deepseek_v3: sigmoid routing within the best of 2 groups, a correction bias, a shared expert and a
#: dense first layer; deepseek_v2: softmax routing. 8 routed experts: 4 a rank at 2 ranks, 2 at 4.
#: Three requests over four ranks leave one rank with no sequence in every step (it still joins
#: the experts' exchanges).
CASES = {"deepseek_v3-ep2": ("deepseek_v3", 2, {"n_group": 2, "topk_group": 1, "vocab_size": 321}),
         "deepseek_v3-ep4": ("deepseek_v3", 4, {"n_group": 2, "topk_group": 1, "vocab_size": 321}),
         "deepseek_v2-ep2": ("deepseek_v2", 2, {})}
PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170))]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def engines(request, tmp_path_factory):
    arch, ranks, overrides = CASES[request.param]
    path = str(tmp_path_factory.mktemp(request.param))
    make_model(path, arch, with_tokenizer=False, **overrides)
    one = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False)
    want = [o.outputs[0].token_ids for o in _generate(one)]
    load = one.expert_load()
    one.shutdown()
    ep = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False, data_parallel_size=ranks,
             enable_expert_parallel=True)
    yield want, load, ep
    ep.shutdown()


def _generate(llm: LLM):
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)


def test_greedy_tokens_equal_the_single_process_engine(engines):
    want, _, ep = engines
    assert [o.outputs[0].token_ids for o in _generate(ep)] == want


def test_greedy_tokens_equal_with_overlap_scheduling(engines, monkeypatch):
    """Overlap feeds each step's samples, still on rank 0's device, into the next step: every rank
    gets them with the step (the CPU does not overlap by default; the test turns it on)."""
    want, _, ep = engines
    driver = ep.engine.runner.ranks
    placeholders = []
    run_step = driver.run_step
    monkeypatch.setattr(driver, "run_step", lambda requests, seqs, prev, forward: placeholders.append(
        prev is not None) or run_step(requests, seqs, prev, forward))
    monkeypatch.setattr(ep.engine, "overlap", True)
    assert [o.outputs[0].token_ids for o in _generate(ep)] == want
    assert any(placeholders)  # (steps did take their tokens from the step left running)


def test_each_rank_holds_only_its_share_of_the_experts(engines):
    _, _, ep = engines
    moe = ep.engine.runner.model.moe_layers()[0]
    ranks = ep.config.data_parallel_size
    assert moe.w13.shape[0] == moe.w2.shape[0] == 8 // ranks
    assert moe.slot_experts() == list(range(8 // ranks))  # (rank 0: the first slots)


def test_requests_are_spread_over_the_ranks(engines, monkeypatch):
    """Each request's blocks come from the rank's range with the most free blocks: the three
    requests, admitted together, run on three ranks (two: one of them on both)."""
    _, _, ep = engines
    driver = ep.engine.runner.ranks
    ran: list[list[int]] = []
    owners = driver.owners
    monkeypatch.setattr(driver, "owners", lambda requests: ran.append(owners(requests)) or ran[-1])
    _generate(ep)
    assert sorted(ran[0]) == sorted(i % ep.config.data_parallel_size for i in range(3))


def test_expert_load_is_summed_over_the_ranks(engines):
    """Each rank counts the tokens of its own requests; rank 0 reads their sum, the single process's count."""
    _, load, ep = engines
    ep.reset_expert_load()
    _generate(ep)
    assert ep.expert_load().tolist() == load.tolist()
