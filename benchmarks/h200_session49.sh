# Session 49: run(command="bash benchmarks/h200_session49.sh a", kind="nvidia-h200", carry=[".whl"],
# timeout_s=600). a: batch 1 in turns (spark_variants): no drafter, deepspark's defaults (speculation
# measured only past a request's first warmup_tokens), the same with warmup_tokens 0 (session 48's
# default); then issue 8's recorded command. b: the gpu-marked tests and the CUDA spec tests (h200_session48.sh d).
. benchmarks/h200_common.sh
case "${1:-a}" in
  a) nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
     python3 benchmarks/host_speed.py > "$OUT/host.txt" 2>&1
     timeout 170 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 5 none= \
       ds=deepspark 'ds-warm0=deepspark:{"deepspark": {"warmup_tokens": 0}}' 2>&1 | filter > "$OUT/b1.txt"
     timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt" ;;
  b) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
       timeout 120 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
     done ;;
esac
# c: a, shorter (3 runs each; what device time was left after refused starts)
case "${1:-a}" in
  c) nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
     python3 benchmarks/host_speed.py > "$OUT/host.txt" 2>&1
     timeout 130 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 3 none= \
       ds=deepspark 'ds-warm0=deepspark:{"deepspark": {"warmup_tokens": 0}}' 2>&1 | filter > "$OUT/b1.txt"
     timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 2>&1 \
       | filter > "$OUT/spec.txt" ;;
esac
# d: batch 1 only, 3 runs each (the device time left)
case "${1:-a}" in
  d) nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
     timeout 150 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 3 none= \
       ds=deepspark 'ds-warm0=deepspark:{"deepspark": {"warmup_tokens": 0}}' 2>&1 | filter > "$OUT/b1.txt" ;;
esac
