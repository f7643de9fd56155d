# H200, session 25, one call each:
#   run(command="bash benchmarks/h200_session25.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # session 24's review fixes on the GPU: the gpu-marked tests of the plugins and the core; then how
  # draft-model's throughput at 64 requests and at batch 1 moves with its depth (k = 5, 4, 3),
  # interleaved with deepspark: is a shallower round worth more than its lost drafts there?
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model \
    'draft-model={"num_speculative_tokens": 4}' 'draft-model={"num_speculative_tokens": 3}' on \
    --runs 5 2>&1 | filter > "$OUT/rounds64.txt"
  timeout 120 python3 benchmarks/lookup_rounds.py --device sm90 none draft-model \
    'draft-model={"num_speculative_tokens": 4}' 'draft-model={"num_speculative_tokens": 6}' on \
    --runs 5 2>&1 | filter > "$OUT/rounds1.txt"
fi
if [ "${1:-a}" = b ]; then
  # the device work of a round by depth (verification, loop and one-token decode graphs, device time
  # alone); the CUDA graph test of speculative steps with the near draft (partial acceptance); 64
  # requests again, 7 runs, draft-model at k = 4, 5, 6 and deepspark, interleaved
  timeout 200 python3 benchmarks/h200_depth_cost.py 2>&1 | filter > "$OUT/depth_cost.txt"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_spec_graphs.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model \
    'draft-model={"num_speculative_tokens": 4}' 'draft-model={"num_speculative_tokens": 6}' on \
    --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = c ]; then
  # the device work of a round by depth, from events around every replay of a generate (call b
  # replayed the graphs on stale inputs: a gather out of bounds); the host's time by function at 64
  # requests, draft-model and deepspark (deepspark's rounds took 3,480 against 2,911 us in call b)
  timeout 240 python3 benchmarks/h200_depth_cost.py 2>&1 | filter > "$OUT/depth_cost.txt"
  for d in draft-model deepspark; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --batch 64 --prompts 128 2>&1 | filter >> "$OUT/parts64.txt"
  done
fi
if [ "${1:-a}" = d ]; then
  # deepspark learns from a sample of 16 requests a round (learn_per_round): the gpu-marked tests of
  # the plugins and the core; 64 requests interleaved, 9 runs; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    'on={"learn_per_round": 256}' --runs 9 2>&1 | filter > "$OUT/rounds64.txt"
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = e ]; then
  # the final code (the chain's rows laid out by numpy from each sequence's first row; learn_per_round):
  # the gpu-marked tests of the plugins and the core, the chained inputs' kernel test compiled; 64
  # requests interleaved, 9 runs; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_chain_inputs.py >> "$OUT/gpu_tests.txt" 2>&1
  timeout 120 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    --runs 9 2>&1 | filter > "$OUT/rounds64.txt"
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = f ]; then
  # the final code once more (call e's host ran slow and noisy): issue 8's recorded command; batch 1
  # and 64 requests interleaved
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
  timeout 120 python3 benchmarks/lookup_rounds.py --device sm90 none draft-model on --runs 9 2>&1 | filter > "$OUT/rounds1.txt"
  timeout 120 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    --runs 9 2>&1 | filter > "$OUT/rounds64.txt"
fi
