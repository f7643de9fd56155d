# H200 run K (session 3): the decode grid cap, one-launch rotary, two-pass argmax.
#   run(command="bash benchmarks/h200_run_k.sh", carry=[".whl"])
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/core/test_sampler.py > "$OUT/gpu_tests.txt" 2>&1
timeout 120 python3 benchmarks/h200_decode_ab.py > "$OUT/decode_ab.txt" 2>&1
for opts in '{}' '{"triton": {"split_size": 128}}'; do
  echo "== plugin options $opts" >> "$OUT/throughput.txt"
  timeout 100 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --gpu-idle --plugin-options "$opts" \
    2>&1 | grep -v -e Writing -e "Loading weights" >> "$OUT/throughput.txt"
done
for opts in '{}' '{"triton": {"split_size": 64}}' '{"triton": {"split_size": 128}}'; do
  echo "== plugin options $opts" >> "$OUT/latency.txt"
  timeout 60 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
    --batch 1 --input-len 512 --output-len 256 --repeats 3 --kv-cache-memory-gb 8 --plugin-options "$opts" \
    2>&1 | grep -v -e Writing -e "Loading weights" >> "$OUT/latency.txt"
done
