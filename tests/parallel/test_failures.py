"""A rank that dies ends the engine with an error naming it, leaving no process; a configuration that
cannot run is refused before any process starts."""
from __future__ import annotations

import os
import signal
import threading

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer import LLM, SamplingParams
from deepinfer.parallel.checks import ParallelConfigError
from deepinfer.parallel.driver import WorkerError
from tests.tiny_models import make_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama"))
    make_model(path, "llama", with_tokenizer=False)  # 4 attention heads, 2 KV heads, MLP width 128
    return path


def _no_process_left() -> bool:
    return not mp.active_children() and not dist.is_initialized()


@pytest.mark.slow
def test_a_killed_rank_ends_generation_with_an_error_naming_it_and_no_process_left(llama):
    llm = LLM(llama, device="cpu", dtype="float32", progress=False, tensor_parallel_size=2)
    (worker,) = llm.engine.runner.ranks.ranks.processes
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0].outputs[0].token_ids) == 4
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    with pytest.raises(WorkerError, match=rf"tensor-parallel rank 1 \(pid {worker.pid}\) died: killed by signal SIGKILL"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)
    assert _no_process_left()
    assert not llm.engine.has_unfinished_requests()  # (the failed step's requests were aborted)
    with pytest.raises(WorkerError, match="ranks were stopped .*rank 1 .* died"):  # and it says so afterwards
        llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)
    llm.shutdown()
    assert _no_process_left()


@pytest.mark.slow
def test_an_exception_on_a_rank_reaches_rank_0_with_its_cause(llama):
    """A command no worker knows makes rank 1 raise; the next step names that rank and its error."""
    llm = LLM(llama, device="cpu", dtype="float32", progress=False, tensor_parallel_size=2)
    llm.engine.runner.ranks._header(99)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(WorkerError, match="tensor-parallel rank 1 failed: RuntimeError: rank 1: unknown command 99"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)
    llm.shutdown()
    assert _no_process_left()


@pytest.mark.slow
def test_an_engine_that_fails_to_build_leaves_no_rank_running(llama):
    with pytest.raises(ValueError, match="the KV pool has 1 blocks"):
        LLM(llama, device="cpu", dtype="float32", progress=False, tensor_parallel_size=2, num_kv_blocks=1)
    assert _no_process_left()


@pytest.mark.slow
def test_a_rank_that_dies_between_steps_is_noticed_at_once(llama, monkeypatch):
    """Rank 0's watch (which aborts an NCCL or HCCL group, where a pending collective would otherwise
    wait for its timeout) sees the death without a step."""
    llm = LLM(llama, device="cpu", dtype="float32", progress=False, tensor_parallel_size=2)
    driver = llm.engine.runner.ranks
    noticed = threading.Event()
    monkeypatch.setattr(driver, "on_rank_death", lambda rank: rank == 1 and noticed.set())
    (worker,) = driver.ranks.processes
    os.kill(worker.pid, signal.SIGKILL)
    assert noticed.wait(10)
    llm.shutdown()
    assert _no_process_left()


@pytest.mark.slow
def test_shutdown_ends_every_rank(llama):
    llm = LLM(llama, device="cpu", dtype="float32", progress=False, tensor_parallel_size=2)
    (worker,) = llm.engine.runner.ranks.ranks.processes
    llm.shutdown()
    assert worker.exitcode == 0  # (it left its loop when told to stop)
    assert _no_process_left()


def test_a_size_that_does_not_divide_the_heads_is_refused_with_the_valid_sizes(llama):
    with pytest.raises(ParallelConfigError, match=r"tensor_parallel_size 3 does not split .* valid sizes: 1, 2, 4$"):
        LLM(llama, device="cpu", progress=False, tensor_parallel_size=3)
    assert _no_process_left()


def test_more_ranks_than_heads_is_refused(llama):
    with pytest.raises(ParallelConfigError, match="tensor_parallel_size 8: more ranks than the model's 4 attention heads .* valid sizes: 1, 2, 4$"):
        LLM(llama, device="cpu", progress=False, tensor_parallel_size=8)
    assert _no_process_left()


def test_a_launcher_with_another_world_size_is_refused(llama, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ParallelConfigError, match=r"the launcher started 4 ranks \(WORLD_SIZE\)"):
        LLM(llama, device="cpu", progress=False, tensor_parallel_size=2)
    assert _no_process_left()


def test_a_deepseek_whose_expert_width_does_not_split_is_refused(tmp_path):
    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1, moe_intermediate_size=33)
    with pytest.raises(ParallelConfigError, match="does not split DeepseekV3ForCausalLM evenly .*expert width 33"
                                                  r"\); valid sizes: 1$"):
        LLM(str(tmp_path), device="cpu", progress=False, tensor_parallel_size=2)
    assert _no_process_left()


def test_a_drafter_is_refused(llama):
    with pytest.raises(ParallelConfigError, match="drafter 'ngram' does not run with tensor parallelism"):
        LLM(llama, device="cpu", progress=False, tensor_parallel_size=2, plugins=["ngram"])
    assert _no_process_left()
