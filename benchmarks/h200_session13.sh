# H200, session 13, one call each:
#   run(command="bash benchmarks/h200_session13.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # single-token GEMV tiles spanning the whole of K (all weights read before the PDL wait): the
  # 16-layer chain with attention per tile set, then batch 1 end to end with the fastest set against
  # the defaults, interleaved
  (cd benchmarks && timeout 260 python3 h200_gemv_fullk.py > "$OUT/fullk_log.txt" 2>&1)
  cp "$OUT/gemv_fullk_best.json" /tmp/best.json 2>/dev/null || echo '{}' > /tmp/best.json
  latency_ab "fastest set" /tmp/best.json
fi
if [ "${1:-a}" = b ]; then
  # every gpu-marked test; deepspark's final estimator (skip_when_slower as committed in session 12)
  # at 64 requests against draft-model, deepspark drafting every round and no drafter, interleaved
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 240 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+always,none --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
fi
if [ "${1:-a}" = c ]; then
  # what a kernel boundary costs alone; the recorded issue-8 command with the final estimator;
  # batch 1 interleaved (skipping applies from 8 requests, so deepspark drafts every round there)
  (cd benchmarks && timeout 60 python3 h200_kernel_floor.py > "$OUT/floor_log.txt" 2>&1)
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 \
    2>&1 | filter > "$OUT/bench_spec.txt"
  (cd benchmarks && timeout 200 python3 h200_spec_ab.py --batch 1 \
    --drafters none,deepspark,draft-model --runs 5 2>&1 | filter > "$OUT/ab_b1.txt")
fi
if [ "${1:-a}" = d ]; then
  # 64 requests with 1,024 new tokens (runs of seconds, not tenths: the estimator's looks and this
  # host's drift weigh less), interleaved and then as bench spec runs the drafters (one after another)
  (cd benchmarks && timeout 240 python3 h200_spec_ab.py --batch 64 --prompts 64 --output-len 1024 \
    --drafters draft-model,deepspark,none --runs 3 2>&1 | filter > "$OUT/ab_b64_1024.txt")
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 64 --output-len 1024 --repeats 3 \
    --drafters none,draft-model,deepspark 2>&1 | filter > "$OUT/bench_spec_1024.txt"
fi
if [ "${1:-a}" = e ]; then
  # the GEMV epilogue's inputs (residual, position, rotary tables, slot) read before the K loop
  # (EARLY_LOADS) against after it: the kernel tests compiled, the 16-layer chain, batch 1 interleaved
  # (ran at 572639f; the flag, the late order and its set and JSON key were removed after call f)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 150 python3 h200_gemv_fullk.py --sets "epilogue reads late" > "$OUT/early_log.txt" 2>&1)
  echo '{"early_loads": false}' > /tmp/late.json
  latency_ab "epilogue reads late" /tmp/late.json
fi
if [ "${1:-a}" = f ]; then
  # (ran at b29ff50, as call e) EARLY_LOADS again: the kernel tests compiled (the bitwise comparison of call e replaced), the
  # 16-layer chain timed both ways in one process, a step kernel by kernel both ways, every
  # gpu-marked test
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 150 python3 h200_gemv_fullk.py --sets "epilogue reads late" > "$OUT/early_log.txt" 2>&1)
  echo '{"early_loads": false}' > /tmp/late.json
  (cd benchmarks && timeout 100 python3 h200_step_trace.py llama-1b > "$OUT/trace_early.txt" 2>&1;
   cp "$OUT/step_trace.txt" "$OUT/step_trace_early.txt";
   timeout 100 python3 h200_step_trace.py llama-1b --tiles /tmp/late.json > "$OUT/trace_late.txt" 2>&1;
   cp "$OUT/step_trace.txt" "$OUT/step_trace_late.txt")
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
fi
if [ "${1:-a}" = g ]; then
  # the final code's batch-1 decode, the recorded command, twice
  for r in 1 2; do
    timeout 80 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = h ]; then
  # the GEMV kernel tests compiled after the review's changes to the early-reads test
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
fi
if [ "${1:-a}" = i ]; then
  # the recorded issue-8 command at 64 requests again, with 5 repeats (call c's gave 0.84x)
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 64 --output-len 256 --repeats 5 \
    --drafters none,draft-model,deepspark 2>&1 | filter > "$OUT/bench_spec_b64.txt"
fi
if [ "${1:-a}" = j ]; then
  # where deepspark's speculative rounds go in the recorded 64-request workload: each round's
  # choice logged, run by run
  (cd benchmarks && timeout 200 python3 h200_spark_log.py --runs 5 2>&1 | filter > "$OUT/spark_log.txt")
fi
