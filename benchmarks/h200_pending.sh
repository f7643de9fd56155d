# H200: the measurements session 1 could not finish (its GPU budget ran out). Run with
#   run(command="bash benchmarks/h200_pending.sh", carry=[".whl"])  after ../shared/gpu/wheels.sh
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_triton_attn.py tests/kernels 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
timeout 120 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 2>&1 | tail -8 | tee "$OUT/spec.txt"
timeout 120 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 --plugins triton \
  --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 | grep -v Writing | tee "$OUT/prefix_triton.txt"
timeout 90 python3 -m deepinfer.cli bench prefill --random-model llama-1b --dtype bfloat16 --device sm90 --plugins triton \
  --batch 4 --input-len 4096 --repeats 3 --kv-cache-memory-gb 16 2>&1 | grep -v Writing | tee "$OUT/prefill.txt"
timeout 150 python3 benchmarks/h200_profile.py llama-1b torch 2>&1 | tail -3 | tee "$OUT/profile.txt"
