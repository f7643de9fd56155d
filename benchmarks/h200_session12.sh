# H200, session 12, one call each:
#   run(command="bash benchmarks/h200_session12.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
NOATT='{"triton": {"single_token_attention": false}}'
if [ "${1:-a}" = a ]; then
  # (ran at commit 74b8c39, reverted after: see docs/benchmarks.md) decode attention folded into the single-token qkv GEMV (QkvAttention): the kernel tests compiled
  # (bfloat16 included), the 16-layer chain fused against unfused, a step's device time kernel by
  # kernel with it on and off, batch 1 end to end interleaved
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_qkv_attention.py 640 > "$OUT/qkv_log.txt" 2>&1)
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b --variants '{}' "$NOATT" > "$OUT/trace_log.txt" 2>&1)
  for r in 1 2; do
    for v in '{}' "$NOATT"; do
      echo "== $v" >> "$OUT/latency.txt"
      timeout 60 $LAT --repeats 2 --plugin-options "$v" 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    done
  done
fi
if [ "${1:-a}" = b ]; then
  # (ran at commit da208fc, reverted after: see docs/benchmarks.md) decode attention's first tile
  # read before the PDL wait (one tile a split): the kernel tests
  # compiled, a step's device time kernel by kernel (decode split 128 and 64), batch 1 twice
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py \
    tests/kernels/test_kv_cache.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b --variants '{}' \
    '{"triton": {"single_token_split": 64}}' > "$OUT/trace_log.txt" 2>&1)
  for v in '{}' '{"triton": {"single_token_split": 64}}' '{}'; do
    echo "== $v" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 --plugin-options "$v" 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = c ]; then
  # every gpu-marked test on main; at 64 requests, deepspark with its round depth from measured
  # costs (loop graph off) against draft-model and deepspark as they are, interleaved
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+step,none --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
fi
if [ "${1:-a}" = d ]; then
  # deepspark's rounds that draft nothing (skip_when_slower) against it drafting every round,
  # draft-model and no drafter (with the scheduler's overlap and without), interleaved, batch 1 and 64
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 1 \
    --drafters none,deepspark,deepspark+always,draft-model,none+sync --runs 5 2>&1 | filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+always,none,none+sync --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
fi
if [ "${1:-a}" = e ]; then
  # call d again after the looks at the slower kind grew ever rarer (the gap doubling)
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 1 \
    --drafters none,deepspark,deepspark+always,draft-model --runs 5 2>&1 | filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+always,none --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
fi
if [ "${1:-a}" = f ] || [ "${1:-a}" = g ]; then
  # f: after rounds that a request joined stopped counting as samples; g: the same after the rates
  # became ratios of averaged seconds and tokens, with looks of four rounds. The A/B at batch 1 and
  # 64, and the recorded command
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 1 \
    --drafters none,deepspark,deepspark+always,draft-model --runs 5 2>&1 | filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+always,none --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 2>&1 | \
    filter > "$OUT/bench_spec.txt"
fi
