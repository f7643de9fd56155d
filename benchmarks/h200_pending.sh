# H200: measurements still pending at the end of session 2 (its GPU time ran out). Run with
#   run(command="bash benchmarks/h200_pending.sh", carry=[".whl"])  after ../shared/gpu/wheels.sh
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
# issue 8: speculative decoding after deepspark's early stop
timeout 150 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 > "$OUT/spec.txt" 2>&1
# issue 5: the prefix-cache benchmark with the Triton backend (now the CUDA default)
timeout 150 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 | grep -v Writing > "$OUT/prefix.txt"
# issue 6: the decode split size at the throughput shape (64 helped batch 1 by 5%)
for split in 64 512; do
  timeout 100 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --plugin-options "{\"triton\": {\"split_size\": $split}}" \
    2>&1 | grep -v -e Writing -e "Loading weights" > "$OUT/throughput_split$split.txt"
done
# issue 7: the second half of benchmarks/h200_swa.sh (a cut sliding-window pool)
timeout 150 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
  --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
  --intervals 128 --max-num-batched-tokens 8192 --sliding-pool-blocks 4096 2>&1 | grep -v Writing > "$OUT/swa_cut.txt"
