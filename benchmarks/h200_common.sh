# Sourced by the per-session H200 scripts: the setup (output to $OUT/env.txt), a filter for the
# benchmarks' progress lines, and the batch-1 decode command of issue 6. grep --line-buffered:
# when the device call's own limit kills the whole pipe, a plain grep loses the lines it has buffered.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
filter() { grep --line-buffered -v -e Writing -e "Loading weights"; }
LAT="python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 --batch 1 \
  --input-len 512 --output-len 256 --kv-cache-memory-gb 8"
# Batch 1 end to end, twice interleaved: the defaults, then the GEMV tiles of the
# JSON file $2 (h200_latency_with.py), labelled $1 in $OUT/latency.txt.
latency_ab() {
  for r in 1 2; do
    echo "== defaults" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== $1" >> "$OUT/latency.txt"
    timeout 60 python3 benchmarks/h200_latency_with.py "$2" -- ${LAT#python3 -m deepinfer.cli} \
      --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
}
# Batch 1 end to end, twice interleaved: the code as it is (labelled $1), then with the
# h200_latency_variant.py flags or the plugin options "$3" (labelled $2), in $OUT/latency.txt.
# $3 starting with "{": plugin options; otherwise the variant script's flags.
latency_vs() {
  for r in 1 2; do
    echo "== $1" >> "$OUT/latency.txt"
    timeout 40 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    echo "== $2" >> "$OUT/latency.txt"
    case "$3" in
      "{"*) timeout 40 $LAT --repeats 2 --plugin-options "$3" 2>&1 ;;
      *) timeout 40 python3 benchmarks/h200_latency_variant.py $3 -- ${LAT#python3 -m deepinfer.cli} --repeats 2 2>&1 ;;
    esac | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
}
# deepspark's lookup off, then on: `bench spec --drafters none,deepspark --batch 1,64` each, into
# $OUT/lookup.txt under "== lookup false$1" and "== lookup true$1".
lookup_off_on() {
  for lk in false true; do
    echo "== lookup $lk$1" >> "$OUT/lookup.txt"
    timeout 100 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,deepspark --batch 1,64 \
      --output-len 256 --repeats 3 --plugin-options "{\"deepspark\": {\"lookup\": $lk}}" \
      2>&1 | filter >> "$OUT/lookup.txt"
  done
}
# Issue 6's acceptance (sessions 18 and 22): every gpu-marked test, then the recorded batch-1
# command three times ($OUT/gpu_tests.txt, $OUT/latency.txt).
issue6_tests_and_latency() {
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2 3; do
    timeout 40 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
}
# Issue 6's other goals: device idle at 64 requests with overlap on and off; prefill 4 x 4,096;
# float32 greedy equality triton vs torch (h200_triton_equal.py); the nano-vllm throughput workload
# with its transformers peer in the same call.
issue6_other_goals() {
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
}
# Issue 8 on the final code (sessions 26 and 27): the gpu-marked tests of the models, plugins and
# core ($OUT/gpu_tests.txt), then, with any argument, issue 8's recorded command ($OUT/spec.txt).
issue8_tests_and_spec() {
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  [ $# -eq 0 ] || timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
    --repeats 5 2>&1 | filter > "$OUT/spec.txt"
}
