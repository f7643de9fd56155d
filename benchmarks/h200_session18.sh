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
  timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2 3; do
    timeout 40 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = d ]; then
  # issue 6's other goals again on the final code: device idle at 64 requests with overlap on and off;
  # prefill 4 x 4,096; float32 greedy equality triton vs torch (h200_triton_equal.py); the nano-vllm
  # throughput workload with its transformers peer in the same call
  for opts in '{}' '{"fcfs": {"overlap": false}}'; do
    echo "== plugin options $opts" >> "$OUT/idle.txt"
    timeout 60 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
      --batch 64 --input-len 512 --output-len 256 --repeats 1 --kv-cache-memory-gb 16 --gpu-idle \
      --plugin-options "$opts" 2>&1 | filter >> "$OUT/idle.txt"
  done
  timeout 60 python3 -m deepinfer.cli bench prefill --random-model llama-1b --dtype bfloat16 --device sm90 \
    --batch 4 --input-len 4096 --repeats 3 --kv-cache-memory-gb 16 2>&1 | filter > "$OUT/prefill.txt"
  timeout 120 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" > "$OUT/equal_log.txt" 2>&1
  timeout 290 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --peer hf --peer-requests 64 --peer-repeats 1 \
    2>&1 | filter > "$OUT/throughput.txt"
fi
if [ "${1:-a}" = e ]; then
  # after the drafters' dtype option (auto keeps the target's dtype on CUDA): the gpu-marked tests of
  # the plugins and the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
