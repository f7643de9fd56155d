# H200 run H (issue 6): offline throughput on the nano-vllm workload (256 requests, lengths uniform
# in [100, 1024], seed 0), Qwen3-0.6B shape, bf16, against transformers' continuous batching on the
# first 64 of its requests (one timed run), with a chart.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 330 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 --peer hf --peer-requests 64 --peer-repeats 1 \
  --gpu-idle --plot "$OUT/throughput.png" 2>&1 | grep -v -e Writing -e "Loading weights" | tee "$OUT/throughput.txt"
