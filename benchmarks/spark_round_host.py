"""The drafter's own host work in a batch-1 round as it runs where the engine verifies in device
graphs (the H200's path: every drafted token verified, the loop graph takes the round, lookup off),
on any machine: the draft runner is stubbed (its propose hands back lazy drafts at once, its chain
does nothing), so only draft-model's and deepspark's own code is timed. A round is what the engine
calls on the drafter: ``on_verified``, ``propose``, ``observe`` and the ``deepinfer_step_end``
hook (through pluggy, as the engine calls it). Median microseconds a round over --rounds rounds,
in --turns turns that alternate the drafters.

    python3 benchmarks/spark_round_host.py [--rounds 20000] [--turns 5]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM
from deepinfer_builtin.drafters.draft_model.runner import Draft


def stubbed(drafter_name: str):
    # (deepspark's batch-1 rounds always speculating, as before session 48: in graphs they may now
    # skip, and this stub's request never grows, so no speculative round would be measured)
    opts = {"deepspark": {"skip_min_batch": 8}} if drafter_name == "deepspark" else {}
    llm = LLM(None, progress=False, device="cpu", plugins=[drafter_name], plugin_options=opts)
    eng = llm.engine
    d = eng.drafter
    rng = random.Random(0)
    conf = [[rng.random() for _ in range(d.k)] for _ in range(64)]
    state = {"n": 0}

    def propose(requests, k, *args, lazy=False, **kw):
        state["n"] += 1
        c = conf[state["n"] % 64]
        return {r.request_id: Draft([-(j + 1) for j in range(k)], None, lambda c=c: c) for r in requests}

    d.runner.propose = propose
    d.runner.chain = lambda *a, **kw: None
    if hasattr(d, "free_verification"):  # what enable_graphs sets (with chained rounds: no lookup)
        d.free_verification = d.in_graphs = True
        d.lookup = False
    eng.add_request("r0", prompt_token_ids=list(range(10, 74)),
                    params=SamplingParams(temperature=0, max_tokens=1 << 20, ignore_eos=True))
    req = eng.requests["r0"].seqs[0]
    return eng, d, req


def time_rounds(eng, d, req, rounds: int) -> float:
    hook, reqs, verified = eng.hooks.deepinfer_step_end, [req], [(req, [-1] * d.k, 0)]
    accepted = [i % 6 for i in range(rounds)]
    t = time.perf_counter()
    for a in accepted:
        d.on_verified(verified, None, None)
        d.propose(reqs)
        d.observe(req, d.k, min(a, d.k))
        hook(engine=eng, num_tokens=d.k + 1)
    return (time.perf_counter() - t) / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--drafters", default="draft-model,deepspark")
    a = ap.parse_args()
    built = {name: stubbed(name) for name in a.drafters.split(",")}
    us: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(a.turns):
        for name, (eng, d, req) in built.items():
            us[name].append(time_rounds(eng, d, req, a.rounds))
    for name, xs in us.items():
        print(f"{name:12s} {statistics.median(xs):6.2f} us a round (runs: {' '.join(f'{x:.2f}' for x in xs)})")


if __name__ == "__main__":
    main()
