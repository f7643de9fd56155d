"""deepspark's batch-1 rounds on the CPU, counted by kind (the lookup's drafts, or the draft
model's after how many draft steps) and by drafts verified, with the drafts they accepted.

    python benchmarks/cpu_round_depths.py [--prompts 4] [--price-steps 0.7]

``--price-steps`` scales the draft-step costs the round depth sees (a what-if: how deep rounds
would go were draft steps that much cheaper; the steps themselves are unchanged)."""
from __future__ import annotations

import argparse
import collections
import time

from deepinfer import LLM, SamplingParams
from deepinfer.bench.spec import stdlib_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--price-steps", type=float, default=1.0)
    args = ap.parse_args()
    llm = LLM(progress=False, plugins=["deepspark"])
    drafter, runner = llm.engine.drafter, llm.engine.drafter.runner
    prompts = stdlib_prompts(llm.get_tokenizer(), args.prompts, 64)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=4), use_tqdm=False)
    depth = [0]  # draft steps of the round under way (0: the lookup's drafts, no model step)
    runner_propose, drafter_propose, update = runner.propose, drafter.propose, drafter.costs.update

    def counted_runner(*a, **k):
        out = runner_propose(*a, **k)
        depth[0] = max((len(d.tokens) for d in out.values()), default=0)
        return out

    rounds: collections.Counter = collections.Counter()
    accepted: collections.Counter = collections.Counter()  # (kind, verified, "sum" or "none")
    kinds: dict[str, tuple[int, int]] = {}  # request -> its round's (steps, verified), until observed
    observe = drafter.observe

    def counted_drafter(requests):
        depth[0] = 0
        out = drafter_propose(requests)
        for rid, p in out.items():
            rounds[depth[0], len(p.verified)] += 1
            kinds[rid] = depth[0], len(p.verified)
        if not out:
            rounds[depth[0], 0] += 1
        return out

    def counted_observe(request, num_verified, num_accepted):
        kind = kinds.pop(request.request_id, None)
        if kind is not None:
            accepted[(*kind, "sum")] += num_accepted
            accepted[(*kind, "none")] += num_accepted == 0
        return observe(request, num_verified, num_accepted)

    runner.propose, drafter.propose, drafter.observe = counted_runner, counted_drafter, counted_observe
    drafter.costs.update = lambda name, s: update(name, s * args.price_steps if name in ("first", "step") else s)
    before = dict(llm.get_metrics())
    t = time.perf_counter()
    for p in prompts:
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    seconds = time.perf_counter() - t
    m = {k: v - before.get(k, 0) for k, v in llm.get_metrics().items() if isinstance(v, (int, float))}
    drafts = m["deepinfer:spec_decode_num_drafts"]
    print(f"{args.prompts * args.output_len / seconds:.1f} tok/s, verified "
          f"{m['deepinfer:spec_decode_num_verified_tokens'] / drafts:.2f} and accepted "
          f"{m['deepinfer:spec_decode_num_accepted_tokens'] / drafts:.2f} a draft")
    for (steps, verified), n in sorted(rounds.items()):
        kind = "lookup" if steps == 0 else f"model, {steps} step{'s' if steps > 1 else ''}"
        if verified:
            kind += f" verified {verified}: {n} rounds, {accepted[steps, verified, 'sum'] / n:.2f} accepted a round, " \
                    f"{accepted[steps, verified, 'none']} accepting none"
        else:
            kind += f" verified 0: {n} rounds"
        print(kind)


if __name__ == "__main__":
    main()
