# H200, session 26, one call each:
#   run(command="bash benchmarks/h200_session26.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # the models' linear layers now go through deepinfer's Linear (a device may give them its own
  # matmul; CUDA keeps F.linear): the gpu-marked tests of the models, plugins and core; issue 8's
  # recorded command
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = b ]; then
  # call a's no drafter at batch 1 (2,481.6 tok/s) was the lowest recorded: issue 6's batch-1 decode
  # command, whose figures span the sessions, and batch 1 of issue 8's command again
  timeout 120 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec1.txt"
fi
if [ "${1:-a}" = c ]; then
  # the review's changes (Device.linear_op takes the model's dtype; the builder asks per model): the
  # gpu-marked tests of the models, plugins and core on the final code
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
fi
