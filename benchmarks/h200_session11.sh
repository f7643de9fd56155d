# H200, session 11, one call each:
#   run(command="bash benchmarks/h200_session11.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # the single-token qkv (and o) GEMVs asking the L2 to fetch the layer's next weights once done, so
  # that they arrive while attention runs: bits and the projection chain (h200_l2_check.py); a
  # step's device time kernel by kernel; batch 1 end to end, interleaved
  (cd benchmarks && timeout 120 python3 h200_l2_check.py > "$OUT/l2_log.txt" 2>&1)
  (cd benchmarks && timeout 200 python3 h200_step_trace.py llama-1b --variants '{}' \
    '{"sm90": {"l2_prefetch_qkv_mb": 24}}' '{"sm90": {"l2_prefetch_qkv_mb": 40}}' \
    '{"sm90": {"l2_prefetch_qkv_mb": 24, "l2_prefetch_o_mb": 16}}' > "$OUT/trace_log.txt" 2>&1)
  for r in 1 2; do
    for v in '{}' '{"sm90": {"l2_prefetch_qkv_mb": 24}}' '{"sm90": {"l2_prefetch_qkv_mb": 24, "l2_prefetch_o_mb": 16}}'; do
      echo "== $v" >> "$OUT/latency.txt"
      timeout 60 $LAT --repeats 2 --plugin-options "$v" 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    done
  done
fi
# a: also ran with the L2 prefetch of commit-less code (kernels/gemv.py PF_PER, dropped: see docs/benchmarks.md)
if [ "${1:-a}" = b ]; then
  # what the device does between two decode steps (42 us a step charged to the replay's first
  # kernel in call a): copies included, overlap on and off
  (cd benchmarks && timeout 200 python3 h200_step_trace.py llama-1b --copies --variants '{}' \
    '{"fcfs": {"overlap": false}}' > "$OUT/trace_log.txt" 2>&1)
fi
if [ "${1:-a}" = c ]; then
  # a step's inputs in one host-to-device copy (PackedInputs) and greedy samples written straight
  # into the decode graphs' placeholder buffer: GPU tests; the step trace with copies; batch 1;
  # deepspark at batch 1 interleaved against no drafter
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py \
    tests/core/test_graph_placeholders.py >> "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b --copies --variants '{}' > "$OUT/trace_log.txt" 2>&1)
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark --runs 7 2>&1 | \
    filter > "$OUT/ab_b1.txt")
fi
if [ "${1:-a}" = d ]; then
  # where a batch-1 deepspark round's host time goes (after call c): cProfile and the device table
  (cd benchmarks && timeout 200 python3 h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 256 \
    --drafters none,deepspark > "$OUT/prof_log.txt" 2>&1)
fi
if [ "${1:-a}" = e ]; then
  # the final code (PackedInputs' views made once): every gpu-marked test; batch 1; the drafters
  # interleaved at batch 1 and 64
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  (cd benchmarks && timeout 120 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark,draft-model --runs 5 2>&1 | \
    filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 110 python3 h200_spec_ab.py --batch 64 --prompts 64 --drafters draft-model,deepspark \
    --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
fi
if [ "${1:-a}" = f ]; then
  # placeholders resolved by one kernel in every replay, and the samples' copy to the host on a
  # stream of its own: GPU tests, the placeholder and argmax kernels compiled, the step trace with
  # copies, batch 1 twice, the drafters interleaved at batch 1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py tests/plugins/test_triton_attn.py > "$OUT/tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_placeholders.py tests/kernels/test_argmax.py \
    tests/core/test_graph_placeholders.py >> "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b --copies --variants '{}' > "$OUT/trace_log.txt" 2>&1)
  for r in 1 2; do timeout 60 $LAT --repeats 3 2>&1 | filter >> "$OUT/latency.txt"; done
  (cd benchmarks && timeout 120 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark,draft-model --runs 5 2>&1 | \
    filter > "$OUT/ab_b1.txt")
fi
if [ "${1:-a}" = g ]; then
  # where a batch-1 deepspark round's host time goes now (after call f): cProfile, 8 prompts
  (cd benchmarks && timeout 200 python3 h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 256 \
    --drafters none,deepspark > "$OUT/prof_log.txt" 2>&1)
  timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_host_copy.py > "$OUT/tests.txt" 2>&1
fi
if [ "${1:-a}" = h ]; then
  # after the review: GPU tests of core, graphs, speculative decoding, attention; the kernel tests
  # of placeholders and argmax compiled; batch 1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py tests/plugins/test_triton_attn.py > "$OUT/tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_placeholders.py tests/kernels/test_argmax.py \
    tests/core/test_graph_placeholders.py tests/core/test_sampler.py >> "$OUT/tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
fi
if [ "${1:-a}" = i ]; then
  # a batch-1 round's wall time by segment, on the host's clock (h200_round_timeline.py)
  (cd benchmarks && timeout 150 python3 h200_round_timeline.py --drafter deepspark > "$OUT/timeline.txt" 2>&1)
  (cd benchmarks && timeout 150 python3 h200_round_timeline.py --drafter draft-model >> "$OUT/timeline.txt" 2>&1)
fi
if [ "${1:-a}" = j ]; then
  # the final code: bench spec at batch 1 and 64, every drafter
  timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --drafters none,draft-model,deepspark,ngram \
    --output-len 256 --repeats 3 2>&1 | filter > "$OUT/spec.txt"
fi
