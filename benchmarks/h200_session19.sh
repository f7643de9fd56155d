# H200, session 19, one call each:
#   run(command="bash benchmarks/h200_session19.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # after deepspark's min_value default went to 0.05 and the CPU's compiled draft step (off on CUDA
  # by default; in graphs deepspark's threshold is 0 anyway): the gpu-marked tests of the plugins and
  # the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
