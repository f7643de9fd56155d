# H200: measurements still pending at the end of session 3 (its GPU time ran out). Run with
#   run(command="bash benchmarks/h200_pending.sh", carry=[".whl"], timeout_s=600)  after ../shared/gpu/wheels.sh
# grep --line-buffered: when the device call's own limit kills the whole pipe, a plain grep loses
# the lines it has buffered. The timeouts below add up to 500 s, under the call's 600.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
# issue 6: the throughput goal is a ratio to transformers run in the same call (its 64-request
# subset takes about 140 s)
timeout 320 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --peer hf --peer-requests 64 --peer-repeats 1 \
  --plot "$OUT/throughput.png" 2>&1 | grep --line-buffered -v -e Writing -e "Loading weights" > "$OUT/throughput.txt"
# issue 5: the prefix-cache benchmark with the Triton backend (now the CUDA default)
timeout 90 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
  --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 \
  | grep --line-buffered -v Writing > "$OUT/prefix.txt"
# issue 7: the second half of benchmarks/h200_swa.sh (a cut sliding-window pool)
timeout 90 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
  --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
  --intervals 128 --max-num-batched-tokens 8192 --sliding-pool-blocks 4096 2>&1 \
  | grep --line-buffered -v Writing > "$OUT/swa_cut.txt"
