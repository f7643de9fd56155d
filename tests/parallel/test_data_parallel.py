"""Data parallelism on a dense model (gloo, on the CPU): two whole replicas, each running its own
requests, give the single-process engine's greedy tokens (the oracle); a rank that dies ends the
engine with an error naming it, leaving no process."""
from __future__ import annotations

import os
import signal

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer import LLM, SamplingParams
from deepinfer.parallel.driver import WorkerError
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # each test spawns a rank

PROMPTS = [[5, 6, 7], list(range(10, 50)), list(range(100, 170)), [9, 8]]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama"))
    make_model(path, "llama", with_tokenizer=False, vocab_size=321)
    return path


def _tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                         use_tqdm=False)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_two_replicas_give_the_single_process_engines_greedy_tokens(llama, tmp_path, arch):
    """qwen3: q/k norms and tied embeddings, each replica whole."""
    path = llama
    if arch == "qwen3":
        path = str(tmp_path)
        make_model(path, "qwen3", with_tokenizer=False, tie_word_embeddings=True)
    one = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False)
    want = _tokens(one)
    one.shutdown()
    two = LLM(path, device="cpu", dtype="float32", block_size=8, progress=False, data_parallel_size=2)
    try:
        ran: list[list[int]] = []
        driver = two.engine.runner.ranks
        owners = driver.owners
        driver.owners = lambda requests: ran.append(owners(requests)) or ran[-1]
        assert _tokens(two) == want
        assert {0, 1} <= {r for step in ran for r in step}  # (both ranks ran requests)
        assert two.engine.runner.model.model.layers[0].mlp.gate_up_proj.weight.shape[0] == 2 * 128  # (whole)
    finally:
        two.shutdown()
    assert not mp.active_children() and not dist.is_initialized()


def test_moe_replicas_give_the_single_process_tokens_and_expert_load(tmp_path):
    """Without expert parallelism each rank holds every expert; the load counts are still every rank's."""
    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    one = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=8, progress=False)
    want, load = _tokens(one), one.expert_load()
    one.shutdown()
    two = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=8, progress=False, data_parallel_size=2)
    try:
        assert two.engine.runner.model.moe_layers()[0].w13.shape[0] == 8  # (every expert on every rank)
        assert _tokens(two) == want
        assert two.expert_load().tolist() == load.tolist()
    finally:
        two.shutdown()


def test_a_killed_rank_ends_generation_with_an_error_naming_it(llama):
    llm = LLM(llama, device="cpu", dtype="float32", progress=False, data_parallel_size=2)
    (worker,) = llm.engine.runner.ranks.ranks.processes
    assert len(_tokens(llm, PROMPTS[:2])) == 2
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    with pytest.raises(WorkerError, match=rf"data-parallel rank 1 \(pid {worker.pid}\) died: killed by signal SIGKILL"):
        _tokens(llm, PROMPTS[:2])
    assert not llm.engine.has_unfinished_requests()
    llm.shutdown()
    assert not mp.active_children() and not dist.is_initialized()


def test_a_rank_found_dead_when_the_expert_load_is_read_is_named(tmp_path):
    """Outside a step too (the expert load, which every rank adds to): the same error as in a step."""
    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", progress=False, data_parallel_size=2,
              enable_expert_parallel=True)
    (worker,) = llm.engine.runner.ranks.ranks.processes
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    with pytest.raises(WorkerError, match=rf"data-parallel rank 1 \(pid {worker.pid}\) died: killed by signal SIGKILL"):
        llm.expert_load()
    llm.shutdown()
    assert not mp.active_children() and not dist.is_initialized()
