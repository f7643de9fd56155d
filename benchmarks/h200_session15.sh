# H200, session 15, one call each:
#   run(command="bash benchmarks/h200_session15.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # session 14's final decode attention (the early table read a compile-time choice), never run on
  # a GPU: its kernel tests compiled and every gpu-marked test; the recorded issue-6 batch-1
  # command; the nano-vllm throughput workload (pass 2 now merges per kv head), deepinfer only
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py > "$OUT/tests.txt" 2>&1
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  timeout 110 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 2>&1 | filter > "$OUT/throughput.txt"
fi
if [ "${1:-a}" = b ]; then
  # prefill graphs (steps of one sequence computing many tokens, replayed; default token counts
  # 16, 32, 48, then multiples of 64 up to 1,024): every gpu-marked test; the first token by
  # prompt length with and without them; the recorded batch-1 command interleaved with
  # --cuda-graph-prefill-sizes none
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_prefill_graphs.py > "$OUT/prefill_graphs.txt" 2>&1
  for r in 1 2; do
    echo "== prefill graphs" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== none" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 --cuda-graph-prefill-sizes none 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = c ]; then
  # graph captures after a set's first skip torch.cuda.graph's garbage collection and cache
  # emptying: start-up time and memory; the graph tests; the first token by prompt length; the
  # recorded batch-1 command twice; a step's device time by kernel
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_prefill_graphs.py \
    tests/plugins/test_graphs.py tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_prefill_graphs.py 2>&1 | filter > "$OUT/prefill_graphs.txt"
  for r in 1 2; do
    timeout 60 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
  (cd benchmarks && timeout 100 python3 h200_step_trace.py llama-1b > "$OUT/trace_log.txt" 2>&1)
fi
