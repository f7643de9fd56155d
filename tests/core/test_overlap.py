"""Overlap scheduling (plan step N+1 while step N runs) must not change any output: the same
tokens, stops, logprobs, cache hits and pool accounting as with overlap off.

The CPU runs a step synchronously, so the engine does not overlap there by default; these tests
switch the overlapped path on (``engine.overlap``) to check its bookkeeping."""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from tests.tiny_models import hybrid, make_model

pytestmark = pytest.mark.slow  # engines compared step by step with overlap on and off


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-overlap")
    make_model(path, "qwen3", **hybrid(12))
    return str(path)


def _workload(seed: int = 0):
    """Mixed prompts (some sharing a prefix) and every kind of sampling parameters."""
    rng = random.Random(seed)
    shared = [rng.randrange(6, 320) for _ in range(20)]
    prompts, params = [], []
    for i in range(14):
        tail = [rng.randrange(6, 320) for _ in range(rng.randrange(1, 40))]
        prompts.append((shared if i % 3 == 0 else []) + tail)
        kind = i % 7
        if kind == 0:
            p = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 30), ignore_eos=True)
        elif kind == 1:  # stops on tokens it is likely to produce
            p = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[7, 11, 13, 17, 19, 23])
        elif kind == 2:
            p = SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i, max_tokens=25, ignore_eos=True)
        elif kind == 3:  # logprobs: these steps are waited for at once
            p = SamplingParams(temperature=0, logprobs=2, max_tokens=12, ignore_eos=True)
        elif kind == 4:  # penalties need every output token on the host
            p = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=15, ignore_eos=True)
        elif kind == 5:
            p = SamplingParams(temperature=0, min_tokens=5, max_tokens=20)
        else:
            p = SamplingParams(n=2, temperature=1.0, seed=7 + i, max_tokens=10, ignore_eos=True)
        params.append(p)
    return prompts, params


def _run(model_dir: str, overlap: bool, **engine):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False,
              plugin_options={"fcfs": {"overlap": overlap}}, **engine)
    assert llm.engine.overlap is False  # the CPU device runs steps synchronously
    llm.engine.overlap = overlap
    deferred = 0
    begin = llm.engine._leave_running

    def counting(flight):
        nonlocal deferred
        deferred += 1
        begin(flight)

    llm.engine._leave_running = counting
    prompts, params = _workload()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    got = [[(c.token_ids, c.finish_reason, c.stop_reason,
             [sorted(lp) for lp in c.logprobs] if c.logprobs else None) for c in o.outputs] for o in outs]
    return llm, got, deferred


@pytest.mark.parametrize("engine", [
    {},
    # 23 blocks: preemption while steps are in flight; 16-token budget: chunked prefill
    {"num_kv_blocks": 23, "max_model_len": 88, "max_num_batched_tokens": 16},
    {"plugins": ["prefix-cache"], "num_kv_blocks": 40, "max_model_len": 88},
], ids=["plain", "preemption", "prefix-cache"])
def test_overlap_gives_the_same_outputs_as_overlap_off(model_dir, engine):
    off_llm, off, deferred_off = _run(model_dir, False, **engine)
    on_llm, on, deferred_on = _run(model_dir, True, **engine)
    assert deferred_off == 0 and deferred_on > 0  # overlap really left steps running
    assert on == off
    assert all(t >= 0 for o in on for c in o for t in c[0])  # (no stand-in for a pending token)
    m_on, m_off = on_llm.get_metrics(), off_llm.get_metrics()
    # (what preemption recomputes, and what the cache holds when, may differ: finished requests
    # free their blocks a step later with overlap)
    for key in ("deepinfer:generation_tokens", "deepinfer:request_success", "deepinfer:prompt_tokens"):
        assert m_on[key] == m_off[key], key
    if "num_kv_blocks" in engine and "plugins" not in engine:
        assert m_on["deepinfer:num_preemptions"] > 0
    for llm in (on_llm, off_llm):
        llm.engine.kv.pool.check_all_free()


def test_overlap_never_schedules_past_a_length_limit(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    llm.engine.overlap = True
    steps = []
    execute = llm.engine.runner.launch

    def recording(sched):
        steps.append(sched.num_tokens)
        return execute(sched)

    llm.engine.runner.launch = recording
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 6
    # one prefill step and five decodes: the step that would compute the sixth token's KV is never run
    assert steps == [3, 1, 1, 1, 1, 1]


def test_abort_while_a_step_is_in_flight_frees_everything(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    eng = llm.engine
    eng.overlap = True
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    eng.add_request("a", list(range(10, 40)), params)
    eng.add_request("b", list(range(50, 62)), params)
    for _ in range(4):
        eng.step()
    assert eng.in_flight is not None
    assert eng.abort_request("a")
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    alone = LLM(model_dir, dtype="float32", block_size=4, progress=False)
    ref = alone.generate({"prompt_token_ids": list(range(50, 62))}, params, use_tqdm=False)[0]
    assert [o.request_id for o in outs] == ["b"]
    assert outs[0].outputs[0].token_ids == ref.outputs[0].token_ids
    eng.kv.pool.check_all_free()


def test_overlap_follows_the_scheduler_option_and_the_device(model_dir):
    from deepinfer_builtin.devices.cpu import CPUDevice

    assert LLM(model_dir, progress=False).engine.overlap is False  # synchronous CPU
    try:
        CPUDevice.asynchronous = True  # as an accelerator would say
        assert LLM(model_dir, progress=False).engine.overlap is True
        off = LLM(model_dir, progress=False, plugin_options={"fcfs": {"overlap": False}})
        assert off.engine.overlap is False
        drafting = LLM(model_dir, progress=False, plugins=["ngram"])
        assert drafting.engine.overlap is False  # a drafter needs every token on the host
        # ... unless it says before each proposal whether it drafts (deepspark on the demo pair,
        # with rounds that may draft nothing and the option on, as by default)
        for options, overlap in (({}, True), ({"overlap_plain_rounds": True, "skip_when_slower": "always"}, True),
                                 ({"overlap_plain_rounds": False, "skip_when_slower": "always"}, False),
                                 ({"overlap_plain_rounds": True, "skip_when_slower": "never"}, False)):
            spark = LLM(progress=False, plugins=["deepspark"], plugin_options={"deepspark": options})
            assert spark.engine.overlap is overlap, options
    finally:
        CPUDevice.asynchronous = False
