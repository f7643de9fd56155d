"""Rounds of sampled requests in device graphs give the eager engine's tokens: drafts drawn in the
sampled loop graphs, drawn step by step, and argmax drafts in the greedy loop graph
(``sampled_drafts``, ``sampled_loop``).

On the CPU the graphs are stood in for by ``EagerGraphs`` (test_graphs.py), with the Triton backend
in the interpreter and its kernels' torch references (tests/reference_kernels.py), in a
subprocess; on a GPU the real CUDA graphs run, with the real kernels.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.interpreter import run_interpreted
from tests.plugins.test_graphs import EagerGraphs, _prompts
from tests.plugins.test_spec_graphs import SPLIT, near_draft

pytestmark = pytest.mark.slow  # whole engines, in subprocesses


def test_sampled_rounds_in_loop_graphs_give_the_eager_tokens_in_the_interpreter(tmp_path):
    from tests.tiny_models import hybrid, make_model

    target = make_model(tmp_path, "qwen3", **hybrid(12))
    near_draft(target, tmp_path / "near")
    res = run_interpreted(["-m", "tests.plugins.test_spec_graphs_sampled", str(tmp_path)], reference_attention=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_sampled_graphs(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.gpu
def test_sampled_rounds_in_cuda_loop_graphs_give_the_eager_tokens(tmp_path):
    from deepinfer_builtin.devices.cuda import CUDAGraphs
    from tests.tiny_models import hybrid, make_model

    target = make_model(tmp_path, "qwen3", **hybrid(12))
    near_draft(target, tmp_path / "near")
    check_sampled_graphs(sampled_both(str(tmp_path), lambda: CUDAGraphs(torch.device("cuda")), device="sm90",
                                      dtype="float32", block_size=4, num_kv_blocks=96, max_model_len=96))


def sampled_both(model_dir: str, graphs_factory, **engine) -> dict:
    """Seeded sampled requests and a greedy one with draft-model (the "+near" draft), each way of
    drafting the sampled ones (drawn, in the sampled loop graphs; drawn, step by step; by argmax,
    in the greedy loop graph), with every step eager and with device graphs: tokens, replays of
    each loop graph (by ``sampled``), the kinds of proposals (with distributions or without),
    accepted drafts."""
    from deepinfer import LLM, SamplingParams
    from deepinfer.core.loop_graphs import DraftLoopGraphs
    from deepinfer_builtin.drafters.draft_model.runner import DraftRunner

    prompts = [{"prompt_token_ids": p} for p in _prompts([5, 3, 29, 8])]
    # (a tiny random model's distributions are flat: the third request's low temperature is what
    # lets argmax drafts be accepted; it decodes last, alone, with no filter that sorts the logits)
    params = [SamplingParams(temperature=t, top_p=p, seed=s, max_tokens=n, ignore_eos=True)
              for t, p, s, n in ((0.8, 0.9, 1, 12), (1.0, 0.95, 2, 24), (0.05, 1.0, 3, 14), (0.0, 1.0, 4, 10))]
    triton = {"triton": {"split_size": SPLIT}}
    loops, propose = DraftLoopGraphs.run_padded, DraftRunner.propose
    counts, kinds = Counter(), set()

    def looping(self, *args, **kwargs):
        counts[str(self.sampled)] += 1
        return loops(self, *args, **kwargs)

    def proposing(self, requests, k, *args, **kwargs):
        drafts = propose(self, requests, k, *args, **kwargs)
        kinds.update("none" if d.probs is None else "q" for r in requests
                     if not r.params.greedy and (d := drafts.get(r.request_id)) is not None)
        return drafts

    modes = {"sampled": {}, "stepwise": {"sampled_loop": False}, "greedy": {"sampled_drafts": "greedy"}}
    DraftLoopGraphs.run_padded, DraftRunner.propose = looping, proposing
    out = {}
    try:
        for mode, options in modes.items():
            # (eager steps have no loop graphs: drafting step by step is the sampled mode's eager run)
            for name in ("eager", "graphs") if mode != "stepwise" else ("graphs",):
                counts.clear()
                kinds.clear()
                llm = LLM(model_dir, plugins=["triton", "draft-model"], progress=False, enforce_eager=True,
                          plugin_options={**triton, "draft-model": {"model": str(Path(model_dir) / "near"),
                                                                    **options}}, **engine)
                if name == "graphs":
                    d, graphs = llm.engine.drafter, graphs_factory()
                    d.enable_graphs(graphs, [1, 2, 4], 64)
                    llm.engine.runner.enable_graphs(graphs, [1, 2, 4], 64)
                    llm.engine.runner.enable_verify_graphs(graphs, [1, 2, 4], 64, d.max_draft_tokens + 1)
                res = llm.generate(prompts, params, use_tqdm=False)
                llm.engine.kv.pool.check_all_free()
                llm.engine.drafter.runner.draft.pool.check_all_free()
                out[f"{mode}/{name}"] = {"tokens": [o.outputs[0].token_ids for o in res], "loops": dict(counts),
                                         "kinds": sorted(kinds),
                                         "accepted": llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"]}
                del llm
    finally:
        DraftLoopGraphs.run_padded, DraftRunner.propose = loops, propose
    return out


def check_sampled_graphs(got: dict) -> None:
    for mode in ("sampled", "stepwise", "greedy"):
        eager, graphs = got["sampled/eager" if mode == "stepwise" else f"{mode}/eager"], got[f"{mode}/graphs"]
        # the same seeded tokens with graphs as without: the same drafts, verified alike
        assert graphs["tokens"] == eager["tokens"], mode
        assert eager["loops"] == {} and eager["accepted"] > 0 and graphs["accepted"] == eager["accepted"], mode
        # drawn drafts carry their distributions; argmax drafts are deterministic
        assert eager["kinds"] == graphs["kinds"] == (["none"] if mode == "greedy" else ["q"]), (mode, eager, graphs)
        loops = graphs["loops"]
        if mode == "sampled":  # rounds with sampled requests in the sampled loop graphs, with the sort and without
            assert loops.get("True", 0) > 0 and loops.get("False", 0) > 0, loops
        elif mode == "stepwise":  # sampled rounds step by step (rounds of the greedy request alone: the greedy loop)
            assert set(loops) <= {"None"}, loops
        else:  # argmax drafts: the greedy loop graph
            assert set(loops) == {"None"} and loops["None"] > 0, loops
    # drafting the argmax changes which drafts are proposed, so the random numbers fall otherwise
    assert got["sampled/eager"]["tokens"] != got["greedy/eager"]["tokens"]


if __name__ == "__main__":
    print(json.dumps(sampled_both(sys.argv[1], EagerGraphs, device="cpu", dtype="float32", block_size=4,
                                  num_kv_blocks=96, max_model_len=96)))
