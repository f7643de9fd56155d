"""The ``eplb`` hook plugin: it places the experts at every interval from the latest window's load
(the placement the placement module gives for that load, the oracle), reads the counters only at
the steps it needs, applies a placement only where it beats the one in force, sets the imbalance
gauges, and refuses models and options it cannot balance; through the engine, on a tiny DeepSeek-V3,
the model records the placement."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.core.metrics import Metrics
from deepinfer.plugins import PluginError
from deepinfer_builtin.eplb.balancer import IMBALANCE, PLANNED, REBALANCES, EPLBOptions, ExpertLoadBalancer
from deepinfer_builtin.eplb.placement import identity_placement, imbalance, rebalance_experts
from tests.tiny_models import make_model

# one MoE layer of four experts; a step routes 10 tokens to each expert and 60 more to the hot one
COLD = torch.tensor([[10, 10, 10, 10]])


def _hot(expert: int) -> torch.Tensor:
    return COLD + 60 * torch.nn.functional.one_hot(torch.tensor([expert]), 4)


class FakeMoEModel:
    """Counts a given load each step (cumulative, as a model's counters do); records every read and
    every placement applied, with the step it came at."""

    def __init__(self) -> None:
        self.counts = torch.zeros(1, 4, dtype=torch.int64)
        self.step = 0
        self.reads: list[int] = []
        self.placements: list[tuple[int, torch.Tensor]] = []

    def run(self, load: torch.Tensor) -> None:
        self.step += 1
        self.counts += load

    def expert_load(self) -> torch.Tensor:
        self.reads.append(self.step)
        return self.counts.clone()

    def reset_expert_load(self) -> None:
        self.counts.zero_()

    def apply_placement(self, physical_to_logical, logical_to_physical, logical_replica_count) -> None:
        self.placements.append((self.step, physical_to_logical))


def _balancer(model, **options) -> tuple[ExpertLoadBalancer, Metrics]:
    plugin, metrics = ExpertLoadBalancer(EPLBOptions(**options)), Metrics()
    plugin.deepinfer_model_loaded(model)
    plugin.deepinfer_register_metrics(metrics)
    plugin.deepinfer_engine_started()
    return plugin, metrics


def _steps(plugin: ExpertLoadBalancer, model: FakeMoEModel, loads: list[torch.Tensor]) -> None:
    for load in loads:
        model.run(load)
        plugin.deepinfer_step_end(num_tokens=int(load.sum()))


def test_placement_at_each_interval_is_made_for_the_latest_window():
    """Interval 4, window 2, two ranks of three slots (two redundant): steps 1-2 make expert 0 hot,
    steps 3-4 expert 3, so the placement at step 4 is the one for steps 3-4's load alone."""
    model = FakeMoEModel()
    plugin, metrics = _balancer(model, interval=4, window=2, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(0), _hot(0), _hot(3)])
    assert model.placements == []
    _steps(plugin, model, [_hot(3)])
    window = 2 * _hot(3)                                   # [[20 20 20 140]]
    [(step, placed)] = model.placements
    assert step == 4 and torch.equal(placed, rebalance_experts(window, 6, 1, 1, 2).physical_to_logical)
    # in force until then, slots e0 e1 e2 | e3 e0 e1 (e0, e1 halved): ranks 10+10+20 = 40 and
    # 140+10+10 = 160 tokens, mean 100
    assert metrics.gauges[IMBALANCE] == pytest.approx(1.6)
    assert metrics.gauges[IMBALANCE] == pytest.approx(imbalance(window, identity_placement(1, 4, 6), 2))
    # planned: e3 on three slots (140/3 each), two of them and a cold expert on one rank: 2 * 140/3 + 20
    assert placed.tolist() == [[3, 3, 2, 3, 0, 1]]
    assert metrics.gauges[PLANNED] == pytest.approx((2 * 140 / 3 + 20) / 100)
    assert metrics.counters[REBALANCES] == 1


def test_a_window_longer_than_the_interval_reaches_back_over_the_previous_interval():
    """Interval 4, window 6: the placement at step 8 is made for steps 3-8 (the counters kept from
    step 2), the one at step 4 for steps 1-4 (all there is)."""
    model = FakeMoEModel()
    plugin, metrics = _balancer(model, interval=4, window=6, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(0)] * 2 + [_hot(3)] * 2)
    first = 2 * _hot(0) + 2 * _hot(3)
    assert metrics.gauges[PLANNED] == pytest.approx(
        imbalance(first, rebalance_experts(first, 6, 1, 1, 2).physical_to_logical, 2))
    _steps(plugin, model, [_hot(3)] * 4)
    window = 6 * _hot(3)
    assert metrics.gauges[PLANNED] == pytest.approx(
        imbalance(window, rebalance_experts(window, 6, 1, 1, 2).physical_to_logical, 2))
    assert metrics.gauges[PLANNED] != pytest.approx(imbalance(
        window + 2 * _hot(0), rebalance_experts(window + 2 * _hot(0), 6, 1, 1, 2).physical_to_logical, 2))


def test_a_counter_reset_inside_the_window_leaves_the_load_since_the_reset():
    model = FakeMoEModel()
    plugin, _ = _balancer(model, interval=4, window=4, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(0)] * 3)
    model.reset_expert_load()
    _steps(plugin, model, [_hot(3)])
    [(_, placed)] = model.placements
    assert torch.equal(placed, rebalance_experts(_hot(3), 6, 1, 1, 2).physical_to_logical)


def test_counters_are_read_only_at_the_window_starts_and_the_intervals():
    model = FakeMoEModel()
    plugin, _ = _balancer(model, interval=4, window=2, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(0)] * 9)
    # step 0: the shape when the model is loaded, the baseline when the engine starts; then each
    # interval (4, 8) and each window's start two steps before it (2, 6)
    assert model.reads == [0, 0, 2, 4, 6, 8]


def test_steps_that_compute_nothing_do_not_count():
    model = FakeMoEModel()
    plugin, _ = _balancer(model, interval=2, window=2, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(3), torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int64)])
    assert model.placements == []
    _steps(plugin, model, [_hot(3)])
    assert [step for step, _ in model.placements] == [4]


def test_a_placement_no_better_than_the_one_in_force_is_not_applied():
    """The same load for two intervals: the second placement equals the first, so nothing moves,
    and the gauge then measures the first placement: what it planned."""
    model = FakeMoEModel()
    plugin, metrics = _balancer(model, interval=3, window=3, num_ranks=2, num_redundant_experts=2)
    _steps(plugin, model, [_hot(2)] * 3)
    planned = metrics.gauges[PLANNED]
    _steps(plugin, model, [_hot(2)] * 3)
    assert [step for step, _ in model.placements] == [3]
    assert metrics.gauges[IMBALANCE] == pytest.approx(planned)
    assert metrics.counters[REBALANCES] == 1


def test_a_window_without_routed_tokens_keeps_the_placement():
    model = FakeMoEModel()
    plugin, metrics = _balancer(model, interval=2, window=2, num_ranks=2, num_redundant_experts=2)
    plugin.deepinfer_step_end(num_tokens=1)  # (a step that routed nothing: the counters did not move)
    plugin.deepinfer_step_end(num_tokens=1)
    assert model.placements == [] and metrics.gauges[IMBALANCE] == 0.0


def test_a_model_without_routed_experts_is_refused_by_name():
    plugin = ExpertLoadBalancer(EPLBOptions())
    with pytest.raises(PluginError, match="object does not: leave eplb out"):
        plugin.deepinfer_model_loaded(object())


def test_options_that_do_not_fit_the_model_are_refused_with_what_to_set():
    plugin = ExpertLoadBalancer(EPLBOptions(num_ranks=3))
    with pytest.raises(PluginError, match=r"4 routed experts: 4 replicas do not divide over 3 GPUs.*num_ranks"):
        plugin.deepinfer_model_loaded(FakeMoEModel())


# ------------------------------------------------------------------------------- through the engine
@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("eplb-v3")
    make_model(path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    return str(path)


def test_the_engine_drives_the_plugin_and_the_model_records_its_placement(deepseek):
    """Tiny DeepSeek-V3 (one MoE layer of 8 experts in 2 groups), interval 4, window 4, planned over
    2 ranks with 2 redundant slots: after 4 model steps the model holds the placement for its load."""
    options = {"interval": 4, "window": 4, "num_ranks": 2, "num_redundant_experts": 2, "num_groups": 2}
    llm = LLM(deepseek, device="cpu", dtype="float32", plugins=["eplb"], plugin_options={"eplb": options},
              progress=False)
    model = llm.engine.runner.model
    llm.generate({"prompt_token_ids": list(range(5, 40))}, SamplingParams(temperature=0, max_tokens=4,
                                                                          ignore_eos=True), use_tqdm=False)
    load = llm.expert_load()  # (every step: the prefill and 3 decodes, 4 in all)
    want = rebalance_experts(load, 10, 2, 1, 2).physical_to_logical
    metrics = llm.get_metrics()
    assert metrics[IMBALANCE] == pytest.approx(imbalance(load, identity_placement(1, 8, 10), 2))
    assert metrics[PLANNED] == pytest.approx(imbalance(load, want, 2))
    assert metrics[PLANNED] < metrics[IMBALANCE]  # (this model's routing: 1.09 against 1.64)
    assert torch.equal(model.expert_placement, want) and metrics[REBALANCES] == 1


def test_the_model_refuses_a_placement_that_does_not_fit_it(deepseek):
    llm = LLM(deepseek, device="cpu", dtype="float32", progress=False)
    model = llm.engine.runner.model
    p = rebalance_experts(torch.ones(1, 8), 10, 1, 1, 2)
    with pytest.raises(ValueError, match="1 MoE layers to 8 logical experts"):
        model.apply_placement(p.physical_to_logical.repeat(2, 1), p.logical_to_physical, p.logical_replica_count)
    wrong_count = p.logical_replica_count.clone()
    wrong_count[0, 0] += 1
    with pytest.raises(ValueError, match="counted as physical_to_logical holds it"):
        model.apply_placement(p.physical_to_logical, p.logical_to_physical, wrong_count)
    model.apply_placement(*p)
    assert torch.equal(model.expert_placement, p.physical_to_logical)


def test_eplb_on_a_model_without_experts_fails_the_build_by_name(tmp_path):
    make_model(tmp_path, "llama", with_tokenizer=False)
    with pytest.raises(PluginError, match="plugin 'eplb' balances the routed experts"):
        LLM(str(tmp_path), device="cpu", dtype="float32", plugins=["eplb"], progress=False)
