"""Acceptance of deepspark's speculative rounds by how many speculative rounds preceded them since
the last plain steps: the rounds' kinds forced in turns (``--plain`` plain engine steps, then
``--spec`` speculative ones; ``--plain 0``: every round speculates), greedy, the demo pair, batch
``--batch``. A draft that catches up wrongly after plain steps accepts less in the rounds right
after them than in later ones (verification keeps the output exact either way)."""
from __future__ import annotations

import argparse
from collections import defaultdict

from deepinfer.core.sampling_params import SamplingParams
from deepinfer.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--plain", type=int, default=8)
    ap.add_argument("--spec", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--stand-in-graphs", action="store_true",
                    help="on the CPU: the device graphs' code paths (verification, loop and chained rounds, "
                         "catch-ups) with tests/plugins/test_graphs.py's EagerGraphs standing in for CUDA graphs (Triton attention: run it with TRITON_INTERPRET=1 and PYTHONPATH at the repository)")
    a = ap.parse_args()
    llm = LLM(None, progress=False, device=a.device, plugins=["deepspark"] + (["triton"] if a.stand_in_graphs else []),
              plugin_options={"deepspark": {"skip_min_batch": 1, "skip_when_slower": "always"}},
              **({"dtype": "float32"} if a.stand_in_graphs else {}))
    eng, d = llm.engine, llm.engine.drafter
    if a.stand_in_graphs:
        from tests.plugins.test_graphs import EagerGraphs

        graphs, sizes, longest = EagerGraphs(), [1, 2, 4], 64 + a.output_len + 16
        d.enable_graphs(graphs, sizes, longest)
        eng.runner.enable_graphs(graphs, sizes, longest)
        eng.runner.enable_verify_graphs(graphs, sizes, longest, d.max_draft_tokens + 1)
        eng.runner.on_verified = d.on_verified  # (rounds chained behind verifications)
    steps = [0]
    step = eng.step

    def counted(*args, **kw):
        steps[0] += 1
        return step(*args, **kw)
    eng.step = counted
    period = a.plain + a.spec
    d.rates.speculate = lambda batch, *more: (a.plain == 0 or steps[0] % period < a.spec, False)
    seen = {"last": None, "run": 0}
    acc: dict[int, list[int]] = defaultdict(list)
    observe = d.observe

    def observed(req, num_verified, num_accepted):
        if seen["last"] != steps[0]:  # (the round's first request: its place in the run of rounds)
            seen["run"] = seen["run"] + 1 if seen["last"] == steps[0] - 1 else 1
            seen["last"] = steps[0]
        acc[seen["run"]].append(num_accepted)
        return observe(req, num_verified, num_accepted)
    d.observe = observed
    words = ["The history of the city", "Once upon a time, a fox", "In mathematics, a group", "The river"]
    prompts = [words[i % len(words)] + f" {i}" for i in range(a.prompts)]
    params = SamplingParams(max_tokens=a.output_len, temperature=0.0, ignore_eos=True)
    for i in range(0, len(prompts), a.batch):
        llm.generate(prompts[i:i + a.batch], params)
    every = [x for v in acc.values() for x in v]
    print(f"plain {a.plain} spec {a.spec} batch {a.batch}: {len(every)} verifications, "
          f"accepted {sum(every) / max(len(every), 1):.2f} a round; by place in the run: "
          + " ".join(f"{k}:{sum(v) / len(v):.2f}({len(v)})" for k, v in sorted(acc.items())[:10]))


if __name__ == "__main__":
    main()
