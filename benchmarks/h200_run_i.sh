# H200 run I (issue 7): the first half of benchmarks/h200_swa.sh within what was left of the
# session's GPU time: swa-replay at the Qwen3-0.6B shape made hybrid (window 2048), 32K contexts.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 200 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
  --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
  --intervals 64,128,256,512 --max-num-batched-tokens 8192 2>&1 | grep -v -e Writing -e "Loading weights" | tee "$OUT/swa.txt"
