# H200, session 22, one call each:
#   run(command="bash benchmarks/h200_session22.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # issue 6's acceptance on this session's code (as session 18's calls c and d, in two calls): every
  # gpu-marked test; the recorded batch-1 command three times
  issue6_tests_and_latency
fi
if [ "${1:-a}" = b ]; then
  # issue 6's other goals (issue6_other_goals in h200_common.sh)
  issue6_other_goals
fi
if [ "${1:-a}" = c ]; then
  # where the host's time goes in batch-1 rounds, function by function (h200_host_parts.py), for
  # deepspark, no drafter and ngram; the round timeline of deepspark
  for d in deepspark none ngram; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --prompts 4 2>&1 | filter >> "$OUT/parts.txt"
  done
  timeout 100 python3 benchmarks/h200_round_timeline.py --prompts 4 2>&1 | filter > "$OUT/timeline.txt"
fi
if [ "${1:-a}" = d ]; then
  # the engine proposes the next round's drafts before the step's text and outputs (early_propose),
  # and graph inputs are filled from Python lists: the gpu-marked tests of the plugins and the core;
  # the host's time by function; early against late proposals, interleaved with no drafter and ngram
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 100 python3 benchmarks/h200_host_parts.py --prompts 4 2>&1 | filter > "$OUT/parts.txt"
  timeout 100 python3 benchmarks/h200_round_timeline.py --prompts 4 2>&1 | filter > "$OUT/timeline.txt"
  timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 none on late ngram --runs 7 \
    2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = e ]; then
  # the final code: the recorded batch-1 command three times back to back (the random model's files
  # are now flushed before timing, and removed at exit); issue 8's recorded command
  for r in 1 2 3; do
    timeout 40 $LAT --repeats 3 2>&1 | filter | grep -e "measured" -e "first" -e rror >> "$OUT/latency.txt"
  done
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = f ]; then
  # deepspark at 64 requests fell to 0.78x draft-model in call e: early proposals against late ones
  # (the engine's early_propose), interleaved with no drafter and draft-model, at batch 64
  timeout 240 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none on late draft-model \
    --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = g ]; then
  # at 64 requests, deepspark's plain rounds overlapped (overlap_plain_rounds), with the lookup on
  # and off, against the defaults and draft-model, interleaved
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 draft-model on \
    'on={"overlap_plain_rounds": true}' 'off={"overlap_plain_rounds": true}' --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
