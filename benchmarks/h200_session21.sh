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
