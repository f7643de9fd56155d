# H200 run M (session 3): GPU tests after the kernel changes, the decode tile sweep, throughput
# with q/k norm fused into the rotary kernel and the fuller bench warm-up.
#   run(command="bash benchmarks/h200_run_m.sh", carry=[".whl"])
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_graphs.py \
  tests/plugins/test_triton_attn.py > "$OUT/gpu_tests.txt" 2>&1
timeout 150 python3 benchmarks/h200_decode_sweep.py > "$OUT/sweep.txt" 2>&1
timeout 120 python3 benchmarks/h200_throughput_profile.py > "$OUT/tprof_runs.txt" 2>&1
for opts in '{}' '{"triton": {"split_size": 128}}'; do
  echo "== plugin options $opts" >> "$OUT/throughput.txt"
  timeout 100 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 --gpu-idle --plugin-options "$opts" \
    2>&1 | grep -v -e Writing -e "Loading weights" >> "$OUT/throughput.txt"
done
