# H200 run N (session 3): the final figures after the decode grid cap, the H200 decode tiles,
# one-launch rotary with Qwen3's q/k norms fused in, and the fuller bench warm-up.
#   run(command="bash benchmarks/h200_run_n.sh", carry=[".whl"])
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_graphs.py \
  tests/plugins/test_triton_attn.py > "$OUT/gpu_tests.txt" 2>&1
timeout 280 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 --peer hf --peer-requests 64 --peer-repeats 1 \
  --gpu-idle --plot "$OUT/throughput.png" 2>&1 | grep -v -e Writing -e "Loading weights" > "$OUT/throughput.txt"
for opts in '{}' '{"triton": {"split_size": 128}}'; do
  echo "== plugin options $opts" >> "$OUT/latency.txt"
  timeout 60 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
    --batch 1 --input-len 512 --output-len 256 --repeats 3 --kv-cache-memory-gb 8 --plugin-options "$opts" \
    2>&1 | grep -v -e Writing -e "Loading weights" >> "$OUT/latency.txt"
done
timeout 60 python3 -m deepinfer.cli bench prefill --random-model llama-1b --dtype bfloat16 --device sm90 \
  --batch 4 --input-len 4096 --repeats 3 --kv-cache-memory-gb 16 2>&1 | grep -v -e Writing -e "Loading weights" > "$OUT/prefill.txt"
timeout 150 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 > "$OUT/spec.txt" 2>&1
