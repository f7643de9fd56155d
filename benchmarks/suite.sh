#!/usr/bin/env bash
# The recorded commands of docs/benchmarks.md, one function per table, each writing OUT/NAME.txt.
#
#   bash benchmarks/suite.sh OUT [NAME ...]      (no NAME: every one for this machine's kind)
#
# On a CUDA machine the GPU commands run (device DEVICE, default sm90); elsewhere the CPU ones.
# Names: ceilings latency idle throughput prefill prefix spec swa structured kvstore disagg kernels deepseek deepseek_model (GPU);
#        latency throughput prefix spec swa serve router (CPU).
set -u
OUT=${1:?usage: bash benchmarks/suite.sh OUT [NAME ...]}
shift
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH="$PY -m deepinfer.cli bench"
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  KIND=gpu DEVICE=${DEVICE:-sm90}
else
  KIND=cpu DEVICE=cpu
fi
# progress bars and weight-loading lines are left out of the results
filter() { grep --line-buffered -v -e Writing -e "Loading weights"; }
run() { local name=$1; shift; echo "== $*" >> "$OUT/$name.txt"; "$@" 2>&1 | filter >> "$OUT/$name.txt"; }

gpu_ceilings() { run ceilings $PY benchmarks/ceilings.py; }
gpu_latency() {
  run latency $BENCH latency --random-model llama-1b --dtype bfloat16 --device "$DEVICE" --batch 1 \
    --input-len 512 --output-len 256 --kv-cache-memory-gb 8 --repeats 3
}
gpu_idle() {
  for opts in '{}' '{"fcfs": {"overlap": false}}'; do
    run idle $BENCH latency --random-model llama-1b --dtype bfloat16 --device "$DEVICE" --batch 64 \
      --input-len 512 --output-len 256 --repeats 1 --kv-cache-memory-gb 16 --gpu-idle --plugin-options "$opts"
  done
}
gpu_throughput() {
  run throughput $BENCH throughput --random-model qwen3-0.6b --dtype bfloat16 --device "$DEVICE" \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --peer hf --peer-requests 64 --peer-repeats 1
}
gpu_prefill() {
  run prefill $BENCH prefill --random-model llama-1b --dtype bfloat16 --device "$DEVICE" --batch 4 \
    --input-len 4096 --repeats 3 --kv-cache-memory-gb 16
}
gpu_prefix() {
  run prefix $BENCH prefix --random-model qwen3-0.6b --dtype bfloat16 --device "$DEVICE" --shared 8000 \
    --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60
}
gpu_spec() { run spec $BENCH spec --device "$DEVICE" --batch 1,64 --output-len 256 --repeats 5; }
gpu_swa() {
  run swa $BENCH swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device "$DEVICE" \
    --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
    --intervals 64,128,256,512 --max-num-batched-tokens 8192
}
gpu_structured() {
  run structured $BENCH structured --random-model llama-1b --dtype bfloat16 --device "$DEVICE" --json-schema builtin \
    --concurrency 64 --num-requests 256 --input-len 256 --max-tokens 1024 --repeats 3 --kv-cache-memory-gb 16
}
gpu_kvstore() {
  # the directory tier on a disk (/var/tmp), not in $OUT; KVSTORE_DIR names another mount (it is kept)
  local dir=${KVSTORE_DIR:-/var/tmp/deepinfer-kvstore-$$}
  run kvstore $BENCH kvstore --random-model llama-1b --dtype bfloat16 --device "$DEVICE" \
    --kv-cache-memory-gb 16 --lengths 512,1024,2048,4096,8192 --repeats 3 --host-gb 8 --dir "$dir"
  [ -n "${KVSTORE_DIR:-}" ] || rm -rf "$dir"
}
gpu_disagg() {
  # two instances on one GPU: each gets a 16 GiB KV budget; the kv-store directory on a disk, not in $OUT
  local dir=${KVSTORE_DIR:-/var/tmp/deepinfer-disagg-$$}
  run disagg $BENCH disagg --random-model llama-1b --dtype bfloat16 --device "$DEVICE" --kv-cache-memory-gb 16 \
    --max-model-len 8192 --num-prompts 64 --concurrency 16 --input-len 4096 --output-len 128 --dir "$dir"
  [ -n "${KVSTORE_DIR:-}" ] || rm -rf "$dir"
}
gpu_kernels() { run kernels $PY -m deepinfer.bench.kernels --out "$OUT/kernels"; }
gpu_deepseek() {
  run deepseek $PY -m deepinfer.bench.moe_kernels --out "$OUT/deepseek"
  run deepseek $PY -m deepinfer.bench.kernels_deepseek --out "$OUT/deepseek" --quick
}
gpu_deepseek_model() {
  local m=(--random-model deepseek-v2-lite --dtype bfloat16 --device "$DEVICE")
  for q in "" "--quantization fp8"; do
    # shellcheck disable=SC2086
    run deepseek_model $BENCH latency "${m[@]}" --batch 1 --input-len 512 --output-len 256 \
      --kv-cache-memory-gb 8 --repeats 3 $q
  done
  run deepseek_model $BENCH throughput "${m[@]}" --num-requests 256 --min-len 100 --max-len 1024 --repeats 1
}

cpu_latency() {
  run latency $BENCH latency --random-model llama-tiny --dtype float32 --device cpu --batch 1 --input-len 512 \
    --output-len 256 --peer hf --repeats 3
  run latency $BENCH latency --random-model llama-tiny --dtype float32 --device cpu --batch 32 --input-len 512 \
    --output-len 256 --peer hf --repeats 2
}
cpu_throughput() {
  run throughput $BENCH throughput --random-model llama-tiny --dtype float32 --device cpu --num-requests 32 \
    --min-len 32 --max-len 256 --peer hf --repeats 1
}
cpu_prefix() {
  run prefix $BENCH prefix --device cpu --shared 1920 --unique 80 --num-requests 16 --repeats 3 \
    --lookup-blocks 100000
}
cpu_spec() {
  run spec $BENCH spec --device cpu --batch 1,64 --drafters none,draft-model,deepspark,ngram --output-len 256 \
    --repeats 3
}
cpu_swa() {
  run swa $BENCH swa --device cpu
  run swa $BENCH swa deepinfer/assets/demo-target --device cpu --context 1536 --turns 4
}
cpu_serve() {
  run serve $BENCH serve --concurrency 64 --num-prompts 200 --input-len 128 --output-len 128 --offline
  run serve $BENCH serve --concurrency 64 --num-prompts 128 --input-len 128 --output-len 128 --offline \
    --offline-threads 1
}
cpu_router() { run router $BENCH router --instances 4 --conversations 24 --turns 4 --concurrency 8; }

if [ $# -eq 0 ]; then
  set -- $(declare -F | awk '{print $3}' | grep "^${KIND}_" | sed "s/^${KIND}_//")
fi
for name in "$@"; do
  if ! declare -F "${KIND}_$name" > /dev/null; then
    echo "no benchmark '$name' on a $KIND machine; known: $(declare -F | awk '{print $3}' | grep "^${KIND}_" \
      | sed "s/^${KIND}_//" | tr '\n' ' ')" >&2
    exit 2
  fi
  "${KIND}_$name"
done
