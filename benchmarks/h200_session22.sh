# H200, session 22, one call each:
#   run(command="bash benchmarks/h200_session22.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # issue 6's acceptance on this session's code (as session 18's calls c and d, in two calls): every
  # gpu-marked test; the recorded batch-1 command three times
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2 3; do
    timeout 40 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = b ]; then
  # issue 6's other goals: device idle at 64 requests with overlap on and off; prefill 4 x 4,096;
  # float32 greedy equality triton vs torch; the nano-vllm throughput workload with its
  # transformers peer in the same call
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
if [ "${1:-a}" = c ]; then
  # where the host's time goes in batch-1 rounds, function by function (h200_host_parts.py), for
  # deepspark, no drafter and ngram; the round timeline of deepspark
  for d in deepspark none ngram; do
    timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --prompts 4 2>&1 | filter >> "$OUT/parts.txt"
  done
  timeout 100 python3 benchmarks/h200_round_timeline.py --prompts 4 2>&1 | filter > "$OUT/timeline.txt"
fi
if [ "${1:-a}" = d ]; then
  # the engine proposes the next round's drafts before the step's text and outputs (early_propose),
  # and graph inputs are filled from Python lists: the gpu-marked tests of the plugins and the core;
  # the host's time by function; early against late proposals, interleaved with no drafter and ngram
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 100 python3 benchmarks/h200_host_parts.py --prompts 4 2>&1 | filter > "$OUT/parts.txt"
  timeout 100 python3 benchmarks/h200_round_timeline.py --prompts 4 2>&1 | filter > "$OUT/timeline.txt"
  timeout 200 python3 benchmarks/lookup_rounds.py --device sm90 none on late ngram --runs 7 \
    2>&1 | filter > "$OUT/rounds.txt"
fi
if [ "${1:-a}" = e ]; then
  # the final code: the recorded batch-1 command three times back to back (the random model's files
  # are now flushed before timing, and removed at exit); issue 8's recorded command
  for r in 1 2 3; do
    timeout 40 $LAT --repeats 3 2>&1 | filter | grep -e "measured" -e "first" -e rror >> "$OUT/latency.txt"
  done
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = f ]; then
  # deepspark at 64 requests fell to 0.78x draft-model in call e: early proposals against late ones
  # (the engine's early_propose), interleaved with no drafter and draft-model, at batch 64
  timeout 240 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 none on late draft-model \
    --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
if [ "${1:-a}" = g ]; then
  # at 64 requests, deepspark's plain rounds overlapped (overlap_plain_rounds), with the lookup on
  # and off, against the defaults and draft-model, interleaved
  timeout 150 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 draft-model on \
    'on={"overlap_plain_rounds": true}' 'off={"overlap_plain_rounds": true}' --runs 7 2>&1 | filter > "$OUT/rounds64.txt"
fi
