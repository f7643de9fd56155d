# H200, session 9 (issue 6: single-token GEMV tiles chosen in a decode step's chain), one call each:
#   run(command="bash benchmarks/h200_session9.sh b", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
# a: ran at commit ffa4c32 (GemvConfig.programs, dropped after): the GEMV tests compiled, the grid
#    sweep of benchmarks/h200_gemv_persist.py, batch 1 with the defaults
if [ "${1:-b}" = b ]; then
  # the tile sweep, with and without prefetch; batch 1 with the defaults and with the sweep's best
  # tiles, interleaved
  (cd benchmarks && timeout 240 python3 h200_gemv_tiles.py > "$OUT/tiles_log.txt" 2>&1)
  for i in 1 2; do
    timeout 45 $LAT --repeats 2 2>&1 | filter >> "$OUT/latency.txt"
    timeout 45 python3 benchmarks/h200_latency_with.py "$OUT/gemv_best.json" -- ${LAT#python3 -m deepinfer.cli } \
      --repeats 2 2>&1 | filter >> "$OUT/latency_best.txt"
  done
fi
if [ "${1:-b}" = c ]; then
  # after b: the new default tiles (gate/up 8 x 256 with 4 warps, down 8 x 1,024 with 8 warps).
  # Batch 1 against session 8's tiles (gemv_session8_tiles.json), interleaved; a batch-1 step's
  # device time kernel by kernel; the triton/torch equality check at batch 1
  for i in 1 2; do
    timeout 45 $LAT --repeats 2 2>&1 | filter >> "$OUT/latency.txt"
    timeout 45 python3 benchmarks/h200_latency_with.py benchmarks/gemv_session8_tiles.json -- \
      ${LAT#python3 -m deepinfer.cli } --repeats 2 2>&1 | filter >> "$OUT/latency_session8_tiles.txt"
  done
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b > "$OUT/trace_log.txt" 2>&1)
  timeout 120 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" llama-1b > "$OUT/equal_log.txt" 2>&1
fi
# two interleaved rounds of batch 1 with each value of one triton option: OPTION FILE_PREFIX VALUES...
interleaved() {
  local opt=$1 prefix=$2; shift 2
  for i in 1 2; do
    for v in "$@"; do
      timeout 45 $LAT --repeats 2 --plugin-options "{\"triton\": {\"$opt\": $v}}" 2>&1 | filter >> "$OUT/$prefix$v.txt"
    done
  done
}
if [ "${1:-b}" = d ]; then
  # decode attention's split at batch 1 (device time kernel by kernel), then end to end, interleaved
  (cd benchmarks && timeout 150 python3 h200_step_trace.py llama-1b --variants '{}' '{"triton": {"split_size": 512}}' \
    '{"triton": {"split_size": 1024}}' '{"triton": {"split_size": 128}}' > "$OUT/trace_log.txt" 2>&1)
  interleaved split_size latency_split 256 512 1024
fi
if [ "${1:-b}" = e ]; then
  # a decode split of its own for single-token steps (triton single_token_split): device time
  # kernel by kernel, then batch 1 end to end, interleaved
  (cd benchmarks && timeout 120 python3 h200_step_trace.py llama-1b --variants '{}' \
    '{"triton": {"single_token_split": 128}}' '{"triton": {"single_token_split": 64}}' > "$OUT/trace_log.txt" 2>&1)
  interleaved single_token_split latency_single 256 128 64
fi
if [ "${1:-b}" = f ]; then
  # the final defaults (tiles of call b, single_token_split 128): kernel tests compiled, the GPU tests
  # of the plugins, the triton/torch equality at batch 1, batch 1 end to end
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_paged_attention.py \
    > "$OUT/kernel_tests.txt" 2>&1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_triton_attn.py tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 100 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" llama-1b > "$OUT/equal_log.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
fi
if [ "${1:-b}" = g ]; then
  # after graph replays resolve placeholders themselves and small vocabularies keep torch's argmax:
  # GPU tests of graphs, speculative decoding, overlap and the argmax; batch 1 (Llama shape, with
  # the time to the first token); the demo target at batch 1 with and without overlap, and deepspark
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py tests/core/test_graph_placeholders.py \
    >> "$OUT/gpu_tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 1 --drafters none,none+sync,deepspark --runs 7 2>&1 | \
    filter > "$OUT/ab_b1.txt")
fi
if [ "${1:-b}" = h ]; then
  # the first token at batch 1 (14.9 ms in call g): device time and host profile of a one-token generate
  (cd benchmarks && timeout 150 python3 h200_ttft_profile.py > "$OUT/ttft_log.txt" 2>&1)
fi
