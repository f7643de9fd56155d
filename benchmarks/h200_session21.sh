# H200, session 21, one call each:
#   run(command="bash benchmarks/h200_session21.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # where deepspark's batch-1 rounds go with lookup in graphs: rounds of lookups against the draft
  # model's, their tokens and wall time (lookup_rounds.py), interleaved with no drafter and ngram
  timeout 400 python3 benchmarks/lookup_rounds.py --device sm90 none off on force ngram --runs 7 \
    2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = b ]; then
  # the draft's catch-up longer than the loop's first step (rounds after lookups) replays the
  # first-step graphs in chunks instead of an eager step: the gpu-marked tests of the plugins, then
  # call a's comparison again
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 benchmarks/lookup_rounds.py --device sm90 none off on force ngram --runs 7 \
    2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = c ]; then
  # call b's comparison with ngram's rounds timed too (lookup rounds, and plain ones)
  timeout 330 python3 benchmarks/lookup_rounds.py --device sm90 none on ngram off --runs 7 \
    2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = d ]; then
  # the demo target's greedy continuations of lookup_rounds.py's prompts on this GPU (bf16), for
  # /tmp-side replays of round policies (which lookups and drafts the target would accept)
  timeout 120 python3 - > "$OUT/seqs.log" 2>&1 <<'PY'
import json, os
from deepinfer.bench.spec import Workload
from deepinfer.llm import LLM
llm = LLM(None, progress=False, device="sm90", kv_cache_memory_gb=2)
wl = Workload(llm, 1, {"prompts": 8, "input_len": 64, "output_len": 256})
outs = llm.generate([{"prompt_token_ids": p} for p in wl.prompts], wl.params, use_tqdm=False)
json.dump([[list(p), list(o.outputs[0].token_ids)] for p, o in zip(wl.prompts, outs)],
          open(os.environ["OUT"] + "/seqs.json", "w"))
PY
fi
if [ "${1:-a}" = e ]; then
  # with the lookup in graphs, rounds without a likely lookup may be plain overlapped steps at any
  # batch size (RoundRates against the model's rounds): on (the new rule) against on-always (every
  # round speculates, the rule before), off and ngram; the gpu-marked tests first
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 benchmarks/lookup_rounds.py --device sm90 none on 'on={"skip_when_slower": "never"}' \
    off ngram --runs 7 2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = f ]; then
  # deepspark's lookup on by default in graphs too: the gpu-marked tests; whether no drafter's,
  # ngram's and deepspark's greedy outputs are the same in bf16 here; then lookup off against the
  # new default, at batch 1 and 64
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 120 python3 - > "$OUT/identity.txt" 2>&1 <<'PY'
from deepinfer.bench.spec import Workload
from deepinfer.llm import LLM
outs = {}
for name in ("none", "ngram", "deepspark"):
    llm = LLM(None, progress=False, device="sm90", kv_cache_memory_gb=2, plugins=[] if name == "none" else [name])
    wl = Workload(llm, 1, {"prompts": 8, "input_len": 64, "output_len": 256})
    outs[name] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in wl.prompts],
                                                               wl.params, use_tqdm=False)]
    del llm
for name in ("ngram", "deepspark"):
    firsts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(outs["none"], outs[name])]
    print(name, "outputs equal to no drafter's:", sum(f is None for f in firsts), "of 8; first difference at", firsts)
PY
  lookup_off_on ""
fi
if [ "${1:-a}" = g ]; then
  # the final code: issue 8's recorded command
  timeout 400 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = h ]; then
  # where a batch-1 deepspark round's host time goes now: the timeline of its landmarks, then
  # cProfile's top functions by own time over four prompts
  timeout 120 python3 benchmarks/h200_round_timeline.py > "$OUT/timeline.txt" 2>&1
  timeout 150 python3 - > "$OUT/profile.txt" 2>&1 <<'PY'
import cProfile, pstats
from deepinfer.bench.spec import Workload
from deepinfer.llm import LLM
llm = LLM(None, progress=False, device="sm90", kv_cache_memory_gb=2, plugins=["deepspark"])
wl = Workload(llm, 1, {"prompts": 4, "input_len": 64, "output_len": 256})
wl.run(llm)
pr = cProfile.Profile()
pr.enable()
wl.run(llm)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(45)
PY
fi
if [ "${1:-a}" = i ]; then
  # the device's kernels at batch 1, no drafter against deepspark (torch profiler; cProfile too)
  cd benchmarks && timeout 200 python3 h200_spec_profile.py --out "$OUT/prof" --drafters none,deepspark --batch 1 \
    --output-len 128 > "$OUT/prof.log" 2>&1
fi
if [ "${1:-a}" = j ]; then
  # the final code (since call g: a catch-up of several chunks waits, before a host buffer of the
  # draft's first-step graphs is filled again, for the replay that read it): the gpu-marked tests,
  # then issue 8's recorded command again
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = k ]; then
  # after the review's refactor of the draft runner (one eager-forward helper): the gpu-marked tests
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
fi
