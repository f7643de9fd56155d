# H200, session 47: run(command="bash benchmarks/h200_session47.sh a", kind="nvidia-h200", carry=[".whl"],
# timeout_s=600), then b, after ../shared/gpu/wheels.sh. No GPU-side change since session 46 (whose
# figures came from an H100): issue 8's commands on an H200 again, and what the host is.
. benchmarks/h200_common.sh
SAMPLED="bench spec --device sm90 --drafters none,draft-model,deepspark --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
case "${1:-a}" in
  # a: the host (its CPU and a pure-Python loop's time: plain decode at batch 1 is bound by the
  # host's Python where the host is slow), issue 8's recorded command (greedy), then sampled once
  a) { grep -m1 "model name" /proc/cpuinfo; nproc; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
       python3 benchmarks/host_speed.py; } > "$OUT/host.txt" 2>&1
     timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt"
     timeout 150 python3 -m deepinfer.cli $SAMPLED 2>&1 | filter > "$OUT/spec_sampled.txt" ;;
  # b: the gpu-marked tests, then on CUDA the chi-square test of sampled speculation and the
  # end-of-context test, one engine a process
  b) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
       timeout 120 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
     done ;;
esac
