# H200, session 24, one call each:
#   run(command="bash benchmarks/h200_session24.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # rounds chained behind their verification (chain_rounds): the gpu-marked tests of the plugins and
  # the core; batch 1 and 64 requests with chaining on and off, interleaved
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 170 python3 benchmarks/lookup_rounds.py --device sm90 none on 'on={"chain_rounds": false}' draft-model \
    'draft-model={"chain_rounds": false}' --runs 7 2>&1 | filter > "$OUT/rounds1.txt"
  timeout 170 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model \
    'draft-model={"chain_rounds": false}' on 'on={"chain_rounds": false}' --runs 5 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = b ]; then
  # the final code: issue 8's recorded command
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = c ]; then
  # chained rounds ran slower than unchained ones in call a (draft-model at batch 1: 991 against 728
  # us a round): the host's time in the chain and the verification, and the device's kernels
  cd benchmarks && timeout 200 python3 h200_chain_profile.py --out "$OUT/chain" 2>&1 | filter > "$OUT/chain.txt"
fi
if [ "${1:-a}" = d ]; then
  # after the fix (a verification step's collect no longer waits for the round chained behind it):
  # the profile again, then batch 1 and 64 requests with chaining on and off, interleaved
  (cd benchmarks && timeout 100 python3 h200_chain_profile.py --out "$OUT/chain" 2>&1 | filter > "$OUT/chain.txt")
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 none on 'on={"chain_rounds": false}' draft-model \
    'draft-model={"chain_rounds": false}' --runs 7 2>&1 | filter > "$OUT/rounds1.txt"
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model \
    'draft-model={"chain_rounds": false}' on 'on={"chain_rounds": false}' --runs 5 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = e ]; then
  # the chained round's inputs in one kernel (deepinfer_kernels.chain_inputs; call d: about 60 small
  # torch kernels, some 80 us a round): the gpu-marked tests of the plugins and the core, the kernel's
  # test compiled; the profile; batch 1 with chaining on and off, interleaved
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_chain_inputs.py >> "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 100 python3 h200_chain_profile.py --out "$OUT/chain" 2>&1 | filter > "$OUT/chain.txt")
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 none on 'on={"chain_rounds": false}' draft-model \
    'draft-model={"chain_rounds": false}' --runs 7 2>&1 | filter > "$OUT/rounds1.txt"
fi
if [ "${1:-a}" = f ]; then
  # the final code (chained rounds; deepspark's lookup off where rounds chain): the gpu-marked tests
  # of the plugins and the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = g ]; then
  # the final code, interleaved: batch 1 (deepspark chained, its lookup off; unchained with the
  # lookup; draft-model) and 64 requests (deepspark against draft-model)
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 none on 'on={"chain_rounds": false}' draft-model \
    --runs 7 2>&1 | filter > "$OUT/rounds1.txt"
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    --runs 5 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = h ]; then
  # 64 requests: deepspark's rounds took 2,527 us for 118 tokens against draft-model's 1,979 for 105
  # in call g; the host's time by function for both
  for d in draft-model deepspark; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --batch 64 --prompts 128 2>&1 | filter >> "$OUT/parts64.txt"
  done
fi
if [ "${1:-a}" = i ]; then
  # the final code once more: issue 8's recorded command, and batch 1 interleaved (9 runs)
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 none on draft-model --runs 9 2>&1 | filter > "$OUT/rounds1.txt"
fi
if [ "${1:-a}" = j ]; then
  # deepspark chooses a round's kind with the verification before it, and chains only rounds that
  # draft (its plain rounds left chained rounds unused in calls g-i): the gpu-marked tests of the
  # plugins and the core; 64 requests interleaved; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 120 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none draft-model on \
    --runs 5 2>&1 | filter > "$OUT/rounds64.txt"
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
