# H200 run G (issues 6 and 8): GPU tests; offline throughput on the nano-vllm workload (Qwen3-0.6B
# shape, bf16) against transformers' continuous batching on 64 of its requests; batch-1 latency
# with a smaller decode split; prefill MFU with a chart; speculative decoding on the demo pair.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py tests/plugins/test_triton_attn.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
timeout 240 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 --peer hf --peer-requests 64 --plot "$OUT/throughput.png" 2>&1 | grep -v Writing | tee "$OUT/throughput.txt"
timeout 60 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 --input-len 512 \
  --output-len 256 --kv-cache-memory-gb 8 --batch 1 --repeats 3 --plugin-options '{"triton": {"split_size": 64}}' 2>&1 | grep -v Writing | tee "$OUT/latency_split64.txt"
timeout 60 python3 -m deepinfer.cli bench prefill --random-model llama-1b --dtype bfloat16 --device sm90 \
  --batch 4 --input-len 4096 --repeats 3 --kv-cache-memory-gb 16 --plot "$OUT/prefill.png" 2>&1 | grep -v Writing | tee "$OUT/prefill.txt"
timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 > "$OUT/spec.txt" 2>&1
tail -12 "$OUT/spec.txt"
