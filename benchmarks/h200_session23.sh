# H200, session 23, one call each:
#   run(command="bash benchmarks/h200_session23.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
parts64() {  # $1: label; the host's time by function at 64 requests for no drafter, draft-model and deepspark
  for d in none draft-model; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --batch 64 --prompts 128 2>&1 | filter >> "$OUT/parts64$1.txt"
  done
  for o in '{}' '{"lookup": false}' '{"overlap_plain_rounds": true}'; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter deepspark --options "$o" --batch 64 --prompts 128 \
      2>&1 | filter >> "$OUT/parts64$1.txt"
  done
}
if [ "${1:-a}" = a ]; then
  # session 22's code at 64 requests: where deepspark's host time goes against draft-model's and no
  # drafter's (its mixed rounds took 5.3-5.9 ms in session 22's calls f and g)
  parts64 ""
fi
if [ "${1:-a}" = b ]; then
  # after the lookups' requests joined the loop graph's rounds, with the leaner _propose and
  # observe: the host's time by function at 64 requests; deepspark against draft-model there,
  # interleaved
  for d in draft-model deepspark; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --batch 64 --prompts 128 2>&1 | filter >> "$OUT/parts64.txt"
  done
  timeout 300 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on off \
    'on={"overlap_plain_rounds": true}' --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = c ]; then
  # the lookup only below 8 requests (lookup_max_batch): deepspark at 64 requests against
  # draft-model and no drafter, with and without overlapped plain rounds, interleaved
  timeout 300 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    'on={"overlap_plain_rounds": true}' --runs 9 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = d ]; then
  # the final code: the gpu-marked tests of the plugins and the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = e ]; then
  # 64 requests: deepspark held to plain rounds (skip_margin 0.95: speculation must be 20x faster to
  # take over), with and without overlapped plain rounds, against the defaults, draft-model and no
  # drafter, interleaved
  timeout 300 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    'on={"skip_margin": 0.95}' 'on={"skip_margin": 0.95, "overlap_plain_rounds": true}' --runs 7 \
    2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = f ]; then
  # 64 requests: plain rounds of batches under 32 gave tokens at half the rate of speculative ones
  # in call e; deepspark speculating below 32 requests, and always, against the defaults
  timeout 300 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    'on={"skip_min_batch": 32}' 'on={"skip_when_slower": "never"}' --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = g ]; then
  # the final code: the gpu-marked tests of the plugins and the core; issue 8's recorded command;
  # at 64 requests deepspark (with RoundRates' per-token seconds) and deepspark speculating every
  # round, against draft-model, interleaved
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
  timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 draft-model on \
    'on={"skip_when_slower": "never"}' --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = h ]; then
  # the lookup at batches 2-7: rounds that mix lookups and the model's drafts took 1.2 ms in the tail of
  # call g's 64-request runs; lookup_max_batch 2 (batch 1 only) against 8, at 4 and 64 requests
  for b in 4 64; do
    timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 --batch $b --prompts 64 draft-model on \
      'on={"lookup_max_batch": 2}' --runs 5 2>&1 | filter > "$OUT/rounds$b.txt"
  done
fi
if [ "${1:-a}" = i ]; then
  # the final code (the lookup only at batch 1 by default): the gpu-marked tests of the plugins and
  # the core; issue 8's recorded command
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
