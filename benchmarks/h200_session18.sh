# H200, session 18, one call each:
#   run(command="bash benchmarks/h200_session18.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # (ran with bc1fed5's code, reverted after) a single token's MLP as one kernel (gemv_mlp): its
  # tests compiled; tiles in the 16-layer chain against the two GEMVs (h200_mlp.py); the recorded
  # batch-1 command interleaved with it off
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mlp.py tests/kernels/test_gemv.py \
    > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 240 python3 h200_mlp.py > "$OUT/mlp_log.txt" 2>&1)
  latency_vs "mlp kernel" "two GEMVs" '{"sm90": {"single_token_mlp": false}}'
fi
if [ "${1:-a}" = b ]; then
  # (ran with bc1fed5's code, as did h200_latency_variant.py's --mlp, since removed) gemv_mlp with
  # down's tiles loaded one step ahead (the first before the wait) and the partials
  # summed 16 columns at once: its tests compiled; the tiles again; the fastest tile end to end
  # against the two GEMVs (h200_latency_variant.py --mlp)
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mlp.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 240 python3 h200_mlp.py > "$OUT/mlp_log.txt" 2>&1)
  tile=$(sed -n 's/^mlp \([0-9,]*\)$/\1/p' "$OUT/mlp_best.txt")
  for r in 1 2; do
    [ -n "$tile" ] || break
    echo "== two GEMVs (single_token_mlp off)" >> "$OUT/latency.txt"
    timeout 40 $LAT --repeats 2 --plugin-options '{"sm90": {"single_token_mlp": false}}' 2>&1 | filter \
      | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    echo "== mlp kernel $tile" >> "$OUT/latency.txt"
    timeout 40 python3 benchmarks/h200_latency_variant.py --mlp "$tile" -- ${LAT#python3 -m deepinfer.cli} --repeats 2 \
      2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = c ]; then
  # the final code (gemv_mlp removed again): every gpu-marked test; the recorded batch-1 command three times
  # (issue6_tests_and_latency in h200_common.sh; the tests' limit was 250 s then)
  issue6_tests_and_latency
fi
if [ "${1:-a}" = d ]; then
  # issue 6's other goals again on the final code (issue6_other_goals in h200_common.sh)
  issue6_other_goals
fi
if [ "${1:-a}" = e ]; then
  # after the drafters' dtype option (auto keeps the target's dtype on CUDA): the gpu-marked tests of
  # the plugins and the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
