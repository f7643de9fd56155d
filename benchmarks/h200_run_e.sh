# H200 run E (issue 6): CUDA graphs and overlap. GPU tests of graphs and the triton backend, a host
# profile of decode steps, batch-1 latency (default, eager, overlap off) and device idle at 64
# concurrent requests with overlap on and off. Llama-3.2-1B shape, bf16.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py tests/plugins/test_triton_attn.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
L="python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 --input-len 512 --output-len 256 --kv-cache-memory-gb 8"
OFF='{"fcfs": {"overlap": false}}'
{
timeout 100 $L --batch 1 --repeats 3 2>&1 | grep -v Writing
echo "== eager (no CUDA graphs)"; timeout 100 $L --batch 1 --repeats 2 --enforce-eager 2>&1 | grep -v Writing | tail -3
echo "== overlap off"; timeout 100 $L --batch 1 --repeats 2 --plugin-options "$OFF" 2>&1 | grep -v Writing | tail -3
} | tee "$OUT/latency_b1.txt"
{
echo "== batch 64, overlap on"; timeout 100 $L --batch 64 --repeats 2 --gpu-idle 2>&1 | grep -v Writing | tail -4
echo "== batch 64, overlap off"; timeout 100 $L --batch 64 --repeats 2 --gpu-idle --plugin-options "$OFF" 2>&1 | grep -v Writing | tail -4
} | tee "$OUT/idle_b64.txt"
timeout 120 python3 benchmarks/h200_profile.py llama-1b triton 2>&1 | tail -3 | tee "$OUT/profile.txt"
