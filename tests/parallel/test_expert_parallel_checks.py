"""Data- and expert-parallel combinations that cannot run are refused before any process starts, with
what is valid (no rank is spawned: these run in milliseconds after the model's config is read)."""
from __future__ import annotations

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer import LLM
from deepinfer.parallel.checks import ParallelConfigError
from deepinfer.plugins import PluginError
from tests.tiny_models import make_model


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ds3"))
    make_model(path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)  # 8 routed experts
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama"))
    make_model(path, "llama", with_tokenizer=False)
    return path


def _no_process_left() -> bool:
    return not mp.active_children() and not dist.is_initialized()


def test_expert_parallelism_without_a_moe_model_is_refused(llama):
    with pytest.raises(ParallelConfigError, match="enable_expert_parallel: LlamaForCausalLM has no routed experts "
                                                  r"to shard .* leave it out \(data_parallel_size alone"):
        LLM(llama, device="cpu", progress=False, data_parallel_size=2, enable_expert_parallel=True)
    assert _no_process_left()


def test_experts_that_do_not_divide_over_the_ranks_are_refused_with_the_valid_sizes(deepseek):
    with pytest.raises(ParallelConfigError, match=r"8 routed experts \+ 0 redundant = 8 expert slots a layer do not "
                                                  r"divide over 3 ranks .* valid data_parallel_size for 8 slots: 2, 4, 8"):
        LLM(deepseek, device="cpu", progress=False, data_parallel_size=3, enable_expert_parallel=True)
    assert _no_process_left()


def test_redundant_experts_count_in_the_slots(deepseek):
    with pytest.raises(ParallelConfigError, match=r"8 routed experts \+ 2 redundant = 10 expert slots .* valid "
                                                  "data_parallel_size for 10 slots: 2, 5, 10"):
        LLM(deepseek, device="cpu", progress=False, data_parallel_size=4, enable_expert_parallel=True,
            num_redundant_experts=2)
    assert _no_process_left()


def test_tensor_and_data_parallelism_together_are_refused(deepseek):
    with pytest.raises(ParallelConfigError, match="tensor_parallel_size 2 with data_parallel_size 2 and "
                                                  "enable_expert_parallel: tensor and data parallelism do not combine "
                                                  "yet; use tensor_parallel_size 1 with data_parallel_size 4"):
        LLM(deepseek, device="cpu", progress=False, tensor_parallel_size=2, data_parallel_size=2,
            enable_expert_parallel=True)
    assert _no_process_left()


def test_redundant_experts_without_expert_parallelism_are_refused(deepseek):
    with pytest.raises(ParallelConfigError, match="num_redundant_experts 4 places expert replicas on expert-parallel "
                                                  "ranks: set enable_expert_parallel"):
        LLM(deepseek, device="cpu", progress=False, data_parallel_size=2, num_redundant_experts=4)
    assert _no_process_left()


def test_a_cache_policy_is_refused_with_data_parallelism(llama):
    """A cached block's KV lives on the rank that wrote it; another rank's request would read garbage."""
    with pytest.raises(ParallelConfigError, match="data_parallel_size 2: cache policy 'prefix-cache' would reuse "
                                                  "blocks whose KV another rank wrote"):
        LLM(llama, device="cpu", progress=False, data_parallel_size=2, plugins=["prefix-cache"])
    assert _no_process_left()


def test_a_drafter_is_refused_with_data_parallelism(llama):
    with pytest.raises(ParallelConfigError, match="data_parallel_size 2: drafter 'ngram' does not run with data "
                                                  "parallelism"):
        LLM(llama, device="cpu", progress=False, data_parallel_size=2, plugins=["ngram"])
    assert _no_process_left()


def test_eplb_options_that_disagree_with_the_engine_are_refused(deepseek):
    with pytest.raises(PluginError, match="plugin 'eplb': option num_ranks 8 disagrees with the engine's expert "
                                          r"parallelism \(2: 2 ranks"):
        LLM(deepseek, device="cpu", progress=False, data_parallel_size=2, enable_expert_parallel=True,
            plugins=["eplb"], plugin_options={"eplb": {"num_ranks": 8}})
    assert _no_process_left()


def test_expert_parallelism_of_one_rank_is_checked_too(llama):
    with pytest.raises(ParallelConfigError, match="enable_expert_parallel: LlamaForCausalLM has no routed experts"):
        LLM(llama, device="cpu", progress=False, enable_expert_parallel=True)
