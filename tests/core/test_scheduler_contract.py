"""A scheduler only chooses: one that adds, schedules (preempting through ``kv.preempt``) and
removes, with no bookkeeping of its own, generates what the built-in one does and leaves every
KV block free; the core advances, finishes and frees the requests."""
from __future__ import annotations

from collections import deque

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.plugins import NoOptions, ScheduledRequest, Scheduler, SchedulerOutput
from tests.tiny_models import make_model


class OneChunkScheduler(Scheduler):
    """Running requests first, then waiting ones; the newest running request is the victim."""

    name = "one-chunk"

    def __init__(self, options, ctx) -> None:
        super().__init__(options, ctx)
        self.waiting: deque = deque()
        self.running: list = []

    def add_request(self, request) -> None:
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        kv, budget, out, preempted = self.ctx.kv, self.ctx.config.max_num_batched_tokens, [], []
        for req in list(self.running):
            if req not in self.running or budget <= 0:
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not kv.allocate(req, n):
                victim = self.running.pop()
                kv.preempt(victim)
                self.waiting.appendleft(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req in self.running:
                out.append(ScheduledRequest(req, n))
                budget -= n
        while self.waiting and budget > 0 and not preempted:
            req = self.waiting[0]
            match = kv.match_prefix(req)
            n = min(req.num_tokens - req.num_computed_tokens - match.num_tokens, budget)
            if not kv.allocate(req, n, match):
                break
            self.running.append(self.waiting.popleft())
            out.append(ScheduledRequest(req, n))
            budget -= n
        return SchedulerOutput(tuple(out), tuple(preempted))

    def remove_request(self, request) -> None:
        (self.running if request in self.running else self.waiting).remove(request)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_model(path, "llama")
    return str(path)


def test_a_scheduler_that_only_chooses_generates_as_fcfs_and_frees_every_block(model_dir):
    prompts = [[(7 * i + j) % 300 + 6 for j in range(9 + 4 * i)] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine = {"dtype": "float32", "block_size": 4, "num_kv_blocks": 7, "max_model_len": 24,
              "max_num_batched_tokens": 16, "progress": False}
    fcfs = LLM(model_dir, **engine)  # (7 blocks of 4 tokens hold one request, not three: preemptions)
    expected = [o.outputs[0].token_ids for o in fcfs.generate([{"prompt_token_ids": p} for p in prompts],
                                                              params, use_tqdm=False)]
    llm = LLM(model_dir, **engine)
    eng = llm.engine
    eng.scheduler = eng.table.scheduler = OneChunkScheduler(NoOptions(), eng.ctx)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.get_metrics()["deepinfer:num_preemptions"] > 0  # (the core counts the victims)
    assert not eng.scheduler.has_unfinished_requests()
    eng.kv.pool.check_all_free()
    assert eng.kv.pool.num_free_blocks == 7
