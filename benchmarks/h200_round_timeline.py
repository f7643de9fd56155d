"""Where a batch-1 speculative round's wall time goes, on the host's clock: stamps at the round's
landmarks (no profiler, so the host runs at its own speed), medians over the rounds of a few
generates. The device work of a round (about 0.5 ms for the demo pair on the H200) runs from the
draft loop graph's replay to the verification's wait; the host's time from that wait's end to the
next round's loop replay is time the device has nothing queued.

    python3 benchmarks/h200_round_timeline.py [--drafter deepspark] [--device sm90] [--prompts 4]

Segments (each from one landmark to the next, in the order a round meets them):
  wait end -> step end      the rest of the verification step (accept, deliver, emit)
  step end -> step start    the caller's loop between two engine steps
  step start -> propose     the engine's step start (hooks), to the drafter's propose
  propose -> loop replay    the drafter and draft runner up to the loop graph's replay
  loop replay               the loop graph's input copy and replay launch
  loop -> verify replay     the rest of the proposal, scheduling, the verification's inputs
  verify replay             the verification graph's input copy and replay launch
  verify -> wait end        the LM head, argmax and the wait for the device (device-bound part)
Where rounds chain, the loop graph's replay is queued inside the verification step, before its
wait (``chain fill`` to ``chain issued``: the chained round's inputs and replay), and the stretch
from the wait's end to the next verification's replay is the host's work while the chained round's
draft steps run.
"""
from __future__ import annotations

import collections
import itertools
import statistics
import time

from host_profile import demo_batch1

from deepinfer.core import engine as engine_mod
from deepinfer.core import model_runner as runner_mod
from deepinfer.core.graphs import DecodeGraphs


def main() -> None:
    a, llm, prompts, params = demo_batch1(__doc__)
    from deepinfer_builtin.drafters.draft_model.loop import DraftLoopGraphs

    marks: list[tuple[str, float]] = []
    clock = time.perf_counter

    def stamp(name, fn, at_end=False):
        def wrapped(*args, **kwargs):
            if not at_end:
                marks.append((name, clock()))
            out = fn(*args, **kwargs)
            if at_end:
                marks.append((name, clock()))
            return out
        return wrapped

    eng = engine_mod.LLMEngine
    drafter_cls = type(llm.engine.drafter)
    patches = [(eng, "step", lambda f: stamp("step start", stamp("step end", f, at_end=True))),
               (drafter_cls, "propose", lambda f: stamp("propose", f)),
               (DraftLoopGraphs, "_upload_and_replay", lambda f: stamp("loop replay", stamp("loop issued", f, True))),
               (DraftLoopGraphs, "run_chained", lambda f: stamp("chain fill", stamp("chain issued", f, True))),
               (runner_mod.ModelRunner, "_verify", lambda f: stamp("wait end", f, at_end=True))]
    plain_upload = DecodeGraphs._upload_and_replay

    def verify_upload(self, *args, **kwargs):  # the verification graphs' (not the loop's, not decode's)
        if self.query_len > 1 and not isinstance(self, DraftLoopGraphs):
            marks.append(("verify replay", clock()))
            out = plain_upload(self, *args, **kwargs)
            marks.append(("verify issued", clock()))
            return out
        return plain_upload(self, *args, **kwargs)

    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in patches]
    for cls, name, wrap in patches:
        setattr(cls, name, wrap(getattr(cls, name)))
    DecodeGraphs._upload_and_replay = verify_upload
    try:
        llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up
        marks.clear()
        t = clock()
        for p in prompts:
            llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
        wall = clock() - t
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
        DecodeGraphs._upload_and_replay = plain_upload
    # rounds: the stretches from one "wait end" to the next; those with the most common order of
    # landmarks (each once) are timed (with the engine's early_propose, the next round's proposal
    # comes before the step's end)
    ends = [i for i, (n, _) in enumerate(marks) if n == "wait end"]
    spans = [marks[i:j + 1] for i, j in itertools.pairwise(ends)]
    orders = collections.Counter(tuple(n for n, _ in span) for span in spans)
    order = next((o for o, _ in orders.most_common() if len(set(o)) == len(o) - 1), None)
    segs: dict[str, list[float]] = {}
    rounds = 0
    for span in spans:
        if order is None or tuple(n for n, _ in span) != order:
            continue
        rounds += 1
        for (n0, t0), (n1, t1) in itertools.pairwise(span):
            segs.setdefault(f"{n0} -> {n1}", []).append((t1 - t0) * 1e6)
    tokens = a.prompts * a.output_len
    print(f"{a.drafter} batch 1, {a.prompts} prompts x {a.output_len} tokens: {tokens / wall:.1f} tok/s, "
          f"{rounds} whole rounds timed")
    total = 0.0
    for k, v in segs.items():
        med = statistics.median(v)
        total += med
        print(f"  {k:32s} {med:8.1f} us (median)")
    print(f"  {'sum of medians (one round)':32s} {total:8.1f} us")


if __name__ == "__main__":
    main()
