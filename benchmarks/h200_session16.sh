# H200, session 16, one call each:
#   run(command="bash benchmarks/h200_session16.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
keep() { echo "{\"sm90\": {\"l2_keep_mb\": $1}}"; }
if [ "${1:-a}" = a ]; then
  # L2 eviction hints on the single-token GEMVs' weights: the 16-layer chain with the LM head,
  # kept sets of several sizes; then the recorded batch-1 command with l2_keep_mb 0, 24 and 40,
  # interleaved
  nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
  python3 -c "import torch; print('L2 bytes', torch.cuda.get_device_properties(0).L2_cache_size)" >> "$OUT/gpu.txt" 2>&1
  (cd benchmarks && timeout 170 python3 h200_l2_evict.py > "$OUT/l2_log.txt" 2>&1)
  for r in 1 2; do
    for mb in 0 24 40; do
      echo "== l2_keep_mb $mb" >> "$OUT/latency.txt"
      timeout 60 $LAT --repeats 2 --plugin-options "$(keep $mb)" 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    done
  done
fi
if [ "${1:-a}" = b ]; then
  # l2_keep_mb 24 by default; the final norm folded into the one-row LM head's GEMV (models return
  # the stream before the final norm); a Triton embedding and the argmax launched with PDL; the
  # staging kernel lets the next kernel launch at once. The recorded batch-1 command twice; every
  # gpu-marked test; the nano-vllm throughput workload (deepinfer only); a step's device time by kernel
  for r in 1 2; do
    timeout 45 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
  timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 90 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 2>&1 | filter > "$OUT/throughput.txt"
  (cd benchmarks && timeout 80 python3 h200_step_trace.py llama-1b > "$OUT/trace_log.txt" 2>&1)
fi
if [ "${1:-a}" = c ]; then
  # (ran at 3adffe3, which held kernels/attn_o.py and benchmarks/h200_attn_o.py; both were removed
  # after) decode attention and o_proj in one launch: its tests compiled, then against the split
  # attention + o GEMV at 640, 1,024 and 2,048 keys, 16 layers, several tiles
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attn_o.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 300 python3 h200_attn_o.py > "$OUT/attn_o_log.txt" 2>&1)
fi
if [ "${1:-a}" = d ]; then
  # an upper bound for decode attention without its merge (h200_merge_bound.py); the recorded
  # batch-1 command with l2_keep_mb 0, 16, 24 and 32, interleaved; the recorded issue-8 command
  (cd benchmarks && timeout 100 python3 h200_merge_bound.py > "$OUT/merge_log.txt" 2>&1)
  for r in 1 2; do
    for mb in 0 16 24 32; do
      echo "== l2_keep_mb $mb" >> "$OUT/latency.txt"
      timeout 45 $LAT --repeats 2 --plugin-options "$(keep $mb)" 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    done
  done
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/bench_spec.txt"
fi
if [ "${1:-a}" = e ]; then
  # o's default tile now 16 rows a program (about one program an SM, each reading its whole tile
  # while attention runs) and l2_keep_mb 16: test_gemv.py compiled; every gpu-marked test; the
  # recorded batch-1 command interleaved with o's tile before (4 rows, o_tile_before_s16.json)
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  latency_ab "o 4 rows (before)" benchmarks/o_tile_before_s16.json
fi
if [ "${1:-a}" = f ]; then
  # decode attention merging in pass 1: only the programs that computed a split take the counter
  # (a batch-1 graph's grid is sized for 8,192 keys: 64 programs a kv head, 5 with work at 640);
  # the kernel tests compiled; every gpu-marked test; the recorded batch-1 command interleaved with
  # the kernel before (benchmarks/paged_attention_s16.py, a copy made for this call, not committed)
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py > "$OUT/tests.txt" 2>&1
  timeout 160 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2; do
    echo "== new" >> "$OUT/latency.txt"
    timeout 40 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    echo "== before" >> "$OUT/latency.txt"
    timeout 40 python3 benchmarks/h200_latency_attn_from.py benchmarks/paged_attention_s16.py -- \
      ${LAT#python3 -m deepinfer.cli} --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = g ]; then
  # (run as this command line at 1c598c2) batch 1 with the single-token split at 64, 256 and 128
  for s in 64 256 128; do
    echo "== split $s" >> "$OUT/lat.txt"
    timeout 35 $LAT --repeats 2 --plugin-options "{\"triton\": {\"single_token_split\": $s}}" 2>&1 \
      | grep -e "measured" -e "first" >> "$OUT/lat.txt"
  done
fi
if [ "${1:-a}" = h ]; then
  # (run as this command line at 1c598c2) batch 1 with l2_keep_mb 8 and 16
  for mb in 8 16; do
    echo "== l2 $mb" >> "$OUT/lat.txt"
    timeout 30 $LAT --repeats 2 --plugin-options "$(keep $mb)" 2>&1 | grep -e "measured" -e "first" >> "$OUT/lat.txt"
  done
fi
