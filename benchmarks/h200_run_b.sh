# H200 run B: Triton kernels (checks, timings, gpu tests), triton vs torch at real shapes,
# prefix-cache benchmark with fresh suffixes, latency with triton, speculative decoding on the demo pair.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
tail -2 "$OUT/env.txt"
timeout 100 python3 -m deepinfer_kernels.bench_kernels --out "$OUT" 2>&1 | tail -25
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_triton_attn.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"
timeout 120 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" 2>&1 | grep -v Writing | tail -6
timeout 90 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 | grep -v Writing | tee "$OUT/prefix.txt"
timeout 45 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 --plugins triton \
  --batch 1 --input-len 512 --output-len 256 --repeats 3 --kv-cache-memory-gb 8 2>&1 | grep -v Writing | tee "$OUT/latency_triton.txt"
timeout 90 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 2>&1 | tee "$OUT/spec.txt"
