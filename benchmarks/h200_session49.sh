# Session 49: run(command="bash benchmarks/h200_session49.sh a", kind="nvidia-h200", carry=[".whl"],
# timeout_s=600).
# a: batch 1 in turns (spark_variants, 5 runs each): no drafter, deepspark's defaults (speculation
#    measured only past a request's first warmup_tokens), the same with warmup_tokens 0 (session 48's
#    default); then issue 8's recorded command (5 repeats).
# b: the gpu-marked tests and the CUDA spec tests (h200_session48.sh d).
# c: a with 3 runs each. d: c's batch-1 part only (what device time was left after refused starts).
[ "${1:-a}" = b ] && exec bash benchmarks/h200_session48.sh d
. benchmarks/h200_common.sh
runs=5; [ "${1:-a}" = a ] || runs=3
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
[ "${1:-a}" = d ] || python3 benchmarks/host_speed.py > "$OUT/host.txt" 2>&1
timeout $((40 + 26 * runs)) python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats $runs \
  none= ds=deepspark 'ds-warm0=deepspark:{"deepspark": {"warmup_tokens": 0}}' 2>&1 | filter > "$OUT/b1.txt"
[ "${1:-a}" = d ] || timeout $((40 + 48 * runs)) python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 \
  --output-len 256 --repeats $runs 2>&1 | filter > "$OUT/spec.txt"
