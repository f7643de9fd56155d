"""Speculative steps replayed from device graphs give the eager engine's drafts and tokens: the
target's verification graphs, the draft's one-token and first-step graphs, the loop graph of a
greedy round, rounds chained behind verifications, and deepspark's lookups joining the loop.

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

pytestmark = pytest.mark.slow  # whole engines, in subprocesses

#: keys per split of the Triton decode kernel (on a GPU): the longest sequences here (67 tokens)
#: span two
SPLIT = 64


@pytest.mark.parametrize(("drafter", "loop"), [("draft-model", True), ("draft-model", False), ("deepspark", True),
                                               ("deepspark", False), ("deepspark+lookup", True),
                                               ("draft-model+near", True)])
def test_speculative_steps_from_graphs_give_the_eager_drafts_and_tokens_in_the_interpreter(tmp_path, drafter, loop):
    from tests.tiny_models import hybrid, make_model

    target = make_model(tmp_path, "qwen3", **hybrid(12))
    if drafter.endswith("+near"):
        near_draft(target, tmp_path / "near")
    res = run_interpreted(["-m", "tests.plugins.test_spec_graphs", str(tmp_path), drafter, str(int(loop))],
                          reference_attention=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_draft_graphs(json.loads(res.stdout.strip().splitlines()[-1]), drafter, loop)


@pytest.mark.gpu
def test_cuda_graphs_of_speculative_steps_give_the_eager_drafts_and_tokens(tmp_path):
    from deepinfer_builtin.devices.cuda import CUDAGraphs
    from tests.tiny_models import hybrid, make_model

    target = make_model(tmp_path, "qwen3", **hybrid(12))
    near_draft(target, tmp_path / "near")
    for drafter, loop in (("draft-model", True), ("draft-model", False), ("deepspark+lookup", True),
                          ("draft-model+near", True)):
        seqs = {"max_num_seqs": 3} if drafter.endswith("+near") else {}  # (as in _main_draft)
        check_draft_graphs(draft_both(str(tmp_path), lambda: CUDAGraphs(torch.device("cuda")), drafter, loop=loop,
                                      device="sm90", dtype="float32", block_size=4, num_kv_blocks=96,
                                      max_model_len=96, **seqs), drafter, loop)


def draft_both(model_dir: str, graphs_factory, drafter: str = "draft-model", loop: bool = True, **engine) -> dict:
    """A drafter whose draft is the target itself, with every step eager and with graphs for the
    target's decode steps, its verification steps and the draft's steps (``loop``: a round's steps
    after the first from one graph; else one graph a step); and the target alone. Tokens,
    proposals, the sizes replayed per kind of graph, accepted drafts. "deepspark+lookup": deepspark
    with its lookup on in both (the loop graph's first step then takes up to k + 1 tokens a
    sequence); plain "deepspark" has it off in both."""
    from deepinfer import LLM, SamplingParams
    from deepinfer.core.graphs import DecodeGraphs
    from deepinfer.core.loop_graphs import DraftLoopGraphs
    from deepinfer.core.second_model import SecondModel
    from deepinfer_builtin.drafters.draft_model.runner import DraftRunner

    lookup = drafter == "deepspark+lookup"
    # "+near": the draft is the target with noise in its weights (near_draft), so that rounds accept
    # some of their drafts and not others
    draft_dir = str(Path(model_dir) / "near") if drafter.endswith("+near") else model_dir
    token_ids = _prompts([5, 3, 29, 9])
    if lookup:  # one prompt that repeats itself, so that its rounds take lookups while others do not
        token_ids[3] = [7, 8, 9, 10] * 2 + [7]
    prompts = [{"prompt_token_ids": p} for p in token_ids]
    greedy = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 34, 24)]
    # penalised: never speculates; it rides in verification graphs as a one-token run, flagged so
    # that attention gives it the decode kernel, as in an eager step
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5), *greedy]
    triton = {"triton": {"split_size": SPLIT}}
    # deepspark: a low bar, so that how many drafts a request verifies varies as acceptance is learnt
    # (and no timing in its round depth or in skipping rounds, nor verifying all in graphs: the two
    # runs must draft alike; with the loop graph no early stop either, since its rounds draft all
    # k; without, the early stop shrinks a round's rows from one one-token replay to the next)
    drafter = drafter.split("+")[0]
    # (the lookup at every batch size: its rounds then mix lookups and the model's drafts, whose
    # lookups' requests join the loop graph)
    extra = {"min_value": 0.04, "cost_aware": False, "verify_all_in_graphs": False, "skip_when_slower": "never",
             "early_stop": not loop, "lookup": lookup, "lookup_max_batch": 64} if drafter == "deepspark" else {}
    extra["loop_graph"] = loop
    base = LLM(model_dir, plugins=["triton"], progress=False, enforce_eager=True, plugin_options=triton, **engine)
    out = {"reference": [o.outputs[0].token_ids for o in base.generate(prompts, params, use_tqdm=False)]}
    del base
    replayed: dict[str, Counter[int]] = {"one-token": Counter(), "verify": Counter(), "verify-multi": Counter(),
                                         "draft-first": Counter(), "catch-up": Counter(), "loop": Counter()}
    proposals: list = []
    flags_wrong: list = []  # padded steps whose one-token flags disagree with their runs
    routing_wrong: list = []  # verification steps without a one-token run in the graphs with the decode pass
    draft_firsts: list = []  # the draft's graphs for a round's first step
    loop_firsts: Counter[int] = Counter()  # the loop replays' first steps, by their most new tokens a sequence
    run, run_padded, propose, catch_up = (DecodeGraphs.run, DecodeGraphs.run_padded, DraftRunner.propose,
                                          SecondModel._catch_up)
    take_chained, chained = DraftRunner._take_chained, Counter()  # rounds queued behind a verification: taken or not
    chained_accepted: Counter[int] = Counter()  # in the rounds taken, each request's drafts accepted before them
    run_chained = DraftLoopGraphs.run_chained
    catching_up = [False]  # the draft's first-step graphs replayed in chunks of a catch-up
    spark, joined = [None], [0]  # the run's drafter; requests with lookups fed to the draft model
    # verification steps by whether the replay gave its argmaxes (greedy_head) and how many times
    # the target computed logits in them ("head:0": read from the replay, nothing launched after it)
    from deepinfer.core.model_runner import ModelRunner
    verify_fn, heads = ModelRunner._verify, Counter()

    def verifying(self, hidden, vs, result, head=None):
        target, calls, logits = self.model, [0], self.model.compute_logits

        def counted(h):
            calls[0] += 1
            return logits(h)
        target.compute_logits = counted
        try:
            verify_fn(self, hidden, vs, result, head)
        finally:
            del target.compute_logits
        heads[f"{'head' if head is not None else 'none'}:{calls[0]}"] += 1

    def counting(self, size, *args, **kwargs):
        replayed["one-token"][size] += 1
        return run(self, size, *args, **kwargs)

    def counting_padded(self, size, tokens, *args, **kwargs):
        kind = "loop" if isinstance(self, DraftLoopGraphs) else "verify" if self.takes_single_runs else "verify-multi"
        if any(self is g for g in draft_firsts):
            kind = "catch-up" if catching_up[0] else "draft-first"
        replayed[kind][size] += 1
        if kind == "loop":
            loop_firsts[max(len(t) for t in tokens)] += 1
        hidden = run_padded(self, size, tokens, *args, **kwargs)
        if kind == "verify" and self.takes_single_runs and all(len(t) > 1 for t in tokens):
            routing_wrong.append([len(t) for t in tokens])  # had no one-token run: the other graphs'
        ins = self.inputs.device(size)  # the flags the replay read (graphs without the pass have none)
        flags = ins["single"].tolist() if "single" in ins else [False] * size
        if flags != [len(t) == 1 for t in tokens] + [False] * (size - len(tokens)):
            flags_wrong.append((self.query_len, [len(t) for t in tokens], flags))
        return hidden

    def recording(self, requests, k, *args, **kwargs):
        drafts = propose(self, requests, k, *args, **kwargs)
        # deepspark's requests that take lookups in a round the loop graph drafts join it, their
        # drafts unused: counted apart (the draft of the others must not change)
        looked_up = getattr(spark[0], "_buckets", {})
        unused = [rid for rid in drafts if type(looked_up.get(rid)).__name__ == "_Lookup"]
        joined[0] += len(unused)
        # (read after the run: drafts left on the device stay there)
        proposals.append(sorted((rid, d) for rid, d in drafts.items() if rid not in unused))
        return drafts

    def counting_chained(self, size, *args, **kwargs):
        replayed["loop"][size] += 1
        return run_chained(self, size, *args, **kwargs)

    def taking(self, chain, requests, *args, **kwargs):
        drafts = take_chained(self, chain, requests, *args, **kwargs)
        chained[drafts is not None] += 1
        for r in requests if drafts is not None else ():  # (rows: (row, seq, length before, ...))
            chained_accepted[len(r.all_token_ids) - chain.rows[r.request_id][2] - 1] += 1
        return drafts

    def chunked(self, *args, **kwargs):
        catching_up[0] = True
        try:
            return catch_up(self, *args, **kwargs)
        finally:
            catching_up[0] = False

    def values(rounds: list) -> list:
        """Each round's drafts as token values, and how many rounds left theirs on the device."""
        lazy = sum(any(d.source is not None for _, d in r) for r in rounds)
        return [[(rid, d.tokens if d.source is None else d.source.resolve(d.tokens)) for rid, d in r]
                for r in rounds], lazy

    DecodeGraphs.run, DecodeGraphs.run_padded, DraftRunner.propose = counting, counting_padded, recording
    SecondModel._catch_up, DraftRunner._take_chained = chunked, taking
    DraftLoopGraphs.run_chained, ModelRunner._verify = counting_chained, verifying
    try:
        for name in ("eager", "graphs"):
            for c in (*replayed.values(), loop_firsts):
                c.clear()
            proposals.clear()
            chained.clear()
            chained_accepted.clear()
            joined[0] = 0
            heads.clear()
            llm = LLM(model_dir, plugins=["triton", drafter], progress=False, enforce_eager=True,
                      plugin_options={**triton, drafter: {"model": draft_dir, **extra}}, **engine)
            spark[0] = llm.engine.drafter
            # rounds chained behind verifications, as on a device that runs queued work asynchronously
            llm.engine.runner.on_verified = llm.engine.drafter.on_verified
            if lookup:  # (rounds of lookups alone are chosen by measured seconds: never here, so that
                llm.engine.drafter.lookups._faster = lambda gain: False  # both runs choose alike)
            if name == "graphs":
                d = llm.engine.drafter
                graphs = graphs_factory()  # one for all three, as the engine does (one memory pool)
                # sequences grow to 67 tokens: the last rounds of the longest outgrow the graphs
                # (a loop round needs room for its k - 1 later steps) and run eagerly
                d.enable_graphs(graphs, [1, 2, 4], 64)
                draft_firsts.append(d.runner.draft.first_graphs)
                llm.engine.runner.enable_graphs(graphs, [1, 2, 4], 64)
                llm.engine.runner.enable_verify_graphs(graphs, [1, 2, 4], 64, d.max_draft_tokens + 1)
            res = llm.generate(prompts, params, use_tqdm=False)
            llm.engine.kv.pool.check_all_free()
            llm.engine.drafter.runner.draft.pool.check_all_free()
            drafted, lazy = values(proposals)
            out[name] = {"tokens": [o.outputs[0].token_ids for o in res], "proposals": drafted, "lazy": lazy,
                         "replayed": {kind: {str(k): v for k, v in c.items()} for kind, c in replayed.items()},
                         "accepted": llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"],
                         "chained": {str(k): v for k, v in chained.items()},
                         "chained_accepted": {str(k): v for k, v in chained_accepted.items()},
                         "accepted_at": [llm.get_metrics().get(f"deepinfer:spec_decode_num_accepted_tokens_pos_{i}", 0)
                                         for i in range(d.max_draft_tokens)] if (d := llm.engine.drafter) else [],
                         "flags_wrong": flags_wrong[:], "routing_wrong": routing_wrong[:], "joined": joined[0],
                         "loop_firsts": {str(k): v for k, v in loop_firsts.items()}, "heads": dict(heads)}
            del llm
    finally:
        DecodeGraphs.run, DecodeGraphs.run_padded, DraftRunner.propose = run, run_padded, propose
        SecondModel._catch_up, DraftRunner._take_chained = catch_up, take_chained
        DraftLoopGraphs.run_chained, ModelRunner._verify = run_chained, verify_fn
    return out


def near_draft(target, out: Path) -> None:
    """The target with noise in its weights, saved as a draft whose greedy tokens are often the
    target's and not always."""
    import copy

    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(torch.randn(w.shape, generator=gen) * w.std() * 0.5 if w.numel() > 1 else 0)
    draft.save_pretrained(out)


def check_draft_graphs(got: dict, drafter: str, loop: bool) -> None:
    near = drafter.endswith("+near")
    assert got["graphs"]["proposals"] == got["eager"]["proposals"]  # draft for draft, the same tokens
    # with the lookup, rounds in graphs that mix lookups and the model's drafts feed the lookups'
    # requests to the loop graph too (the eager steps leave them out)
    assert got["eager"]["joined"] == 0
    assert (got["graphs"]["joined"] > 0) == (drafter == "deepspark+lookup"), got["graphs"]["joined"]
    # with the lookup on, the loop graph's first step takes up to k + 1 tokens a sequence (rounds
    # after a lookup's; here at least the rounds after a prompt, whose surplus is computed first);
    # without it, at most two
    longest = max(map(int, got["graphs"]["loop_firsts"]), default=0)
    assert (longest > 2) == (drafter == "deepspark+lookup"), got["graphs"]["loop_firsts"]
    drafter = drafter.split("+")[0]
    # draft-model's loop rounds leave their drafts on the device for the verification to read
    # there (deepspark's here choose what to verify, which needs the drafts on the host)
    assert got["eager"]["lazy"] == 0
    assert (got["graphs"]["lazy"] > 0) == (loop and drafter == "draft-model")
    # those rounds are chained behind their verifications: the next proposal takes most (not the
    # rounds after a request joins); others chain none
    taken = got["graphs"]["chained"]
    assert (taken.get("True", 0) > taken.get("False", 0)) == (got["graphs"]["lazy"] > 0), taken
    accepted_at = got["graphs"]["accepted_at"]
    assert accepted_at == got["eager"]["accepted_at"]
    if near:  # rounds that accept some drafts and not all, chained rounds taken after them
        assert 0 < accepted_at[0] and accepted_at[-1] < accepted_at[0], accepted_at
        assert any(0 < int(a) < 5 for a in got["graphs"]["chained_accepted"]), got["graphs"]["chained_accepted"]
    elif got["graphs"]["lazy"]:  # the draft is the target: every draft accepted
        assert set(got["graphs"]["chained_accepted"]) == {"5"}, got["graphs"]["chained_accepted"]
    assert got["graphs"]["tokens"] == got["eager"]["tokens"] == got["reference"]
    # replayed verifications (every verifying request greedy, no logprobs) read the replay's
    # argmaxes and compute no logits; those that run eagerly (the longest sequences' last rounds,
    # past the graphs' length) compute them once
    assert set(got["graphs"]["heads"]) <= {"head:0", "none:1"} and got["graphs"]["heads"].get("head:0"), \
        got["graphs"]["heads"]
    assert set(got["eager"]["heads"]) == {"none:1"}, got["eager"]["heads"]
    replayed = got["graphs"]["replayed"]
    # draft steps after a round's first are one token per sequence: replays of 4 (3 padded to 4;
    # "+near" runs two greedy requests at a time), of 1, from one-token graphs, or with the loop,
    # whole rounds from the loop graph (the rounds after a prompt, whose first step computes it,
    # draft step by step)...
    steps = replayed["loop" if loop else "one-token"]
    assert steps.get("2" if near else "4", 0) > 0 and steps.get("1", 0) > 0
    if not loop:
        assert replayed["loop"] == {}
    # ... verification steps replay theirs, the penalised request's one-token run in them too: 4
    # sequences, then fewer (with deepspark, requests verify different numbers of drafts, so the
    # rows behind a short run must not shift: a test of the padded layout) ...
    verify = replayed["verify"] | replayed["verify-multi"]
    assert verify.get("4", 0) > 0 and len(verify) >= 2
    # steps with the penalised request's one-token run replay the graphs with attention's decode
    # pass; once it has finished, every sequence verifies drafts: the graphs without that pass
    # (here deepspark's verification steps after it come to hold drafting requests only)
    assert replayed["verify"] and (replayed["verify-multi"] or drafter != "deepspark")
    assert got["graphs"]["routing_wrong"] == []
    # ... and so do the draft's first steps of a round with two new tokens (the last draft and the
    # target's, when every draft was accepted; deepspark, still learning here, stops drafting
    # before its last drafts and so never has two; with the loop, those steps are the loop's)
    if drafter == "draft-model" and not loop:
        assert sum(replayed["draft-first"].values()) > 0
    # with the lookup, a catch-up longer than the loop's first step (here the first round, whose
    # longest feed, the 29-token prompt and its token, takes four chunks of k + 1 = 6 and the loop's
    # first step the rest) replays the first-step graphs in chunks; without it, that round's feeds
    # are over four chunks of 2 and run eagerly ("+near": the last request starts decoding alone, and
    # its 9-token prompt takes four chunks of 2)
    assert (sum(replayed["catch-up"].values()) > 0) == (longest > 2 or near), replayed["catch-up"]
    assert got["graphs"]["flags_wrong"] == []
    assert got["eager"]["replayed"] == {"one-token": {}, "verify": {}, "verify-multi": {}, "draft-first": {},
                                        "catch-up": {}, "loop": {}}
    assert got["graphs"]["accepted"] > 0  # the draft is the target itself: drafts are accepted


def _main_draft(model_dir: str, drafter: str, loop: bool) -> None:
    # "+near": three sequences at a time, so that the last request starts decoding while others do
    seqs = {"max_num_seqs": 3} if drafter.endswith("+near") else {}
    print(json.dumps(draft_both(model_dir, EagerGraphs, drafter, loop, device="cpu", dtype="float32", block_size=4,
                                num_kv_blocks=96, max_model_len=96, **seqs)))


if __name__ == "__main__":
    _main_draft(sys.argv[1], sys.argv[2], sys.argv[3] == "1")
