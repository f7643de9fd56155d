# H200 run L (session 3): where the throughput workload's time goes, after the decode grid cap.
#   run(command="bash benchmarks/h200_run_l.sh", carry=[".whl"])
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 150 python3 benchmarks/h200_throughput_profile.py > "$OUT/tprof_runs.txt" 2>&1
mkdir -p "$OUT/s128" && OUT="$OUT/s128" timeout 150 python3 benchmarks/h200_throughput_profile.py '{"triton": {"split_size": 128}}' > "$OUT/s128/tprof_runs.txt" 2>&1
for opts in '{}' '{"triton": {"split_size": 64}}'; do
  echo "== plugin options $opts" >> "$OUT/latency.txt"
  timeout 60 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
    --batch 1 --input-len 512 --output-len 256 --repeats 3 --kv-cache-memory-gb 8 --plugin-options "$opts" \
    2>&1 | grep -v -e Writing -e "Loading weights" >> "$OUT/latency.txt"
done
