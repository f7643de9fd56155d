# H200: swa-replay (issue 7) at a real shape: the Qwen3-0.6B shape made hybrid (3 sliding-window
# layers of window 2048 to 1 full-attention layer), 8 conversations of 8 turns growing to 32K
# tokens, bf16, a fixed 40 GiB KV budget. Run with
#   run(command="bash benchmarks/h200_swa.sh", carry=[".whl"])  after ../shared/gpu/wheels.sh
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
tail -2 "$OUT/env.txt"
timeout 420 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
  --plugins triton --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
  --intervals 64,128,256,512 --max-num-batched-tokens 8192 2>&1 | grep -v Writing | tee "$OUT/swa.txt"
# the same with the sliding-window pool cut to 4096 blocks: old checkpoints are evicted first
timeout 150 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
  --plugins triton --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
  --intervals 128 --max-num-batched-tokens 8192 --sliding-pool-blocks 4096 2>&1 | grep -v Writing | tee -a "$OUT/swa.txt"
