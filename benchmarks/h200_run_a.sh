# H200 run A: prefix-cache benchmark (Qwen3-0.6B shape) and batch-1 latency (Llama-3.2-1B shape).
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 -m deepinfer.cli plugins list | tee -a "$OUT/env.txt"
timeout 300 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 | grep -v Writing | tee "$OUT/prefix.txt"
timeout 200 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
  --batch 1 --input-len 512 --output-len 256 --repeats 3 --kv-cache-memory-gb 8 2>&1 | grep -v Writing | tee "$OUT/latency.txt"
