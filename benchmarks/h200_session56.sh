# Session 56: run(command="bash benchmarks/h200_session56.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600).
# Issue 8 on the final code (session 55's choice for a request alone, with its review fixes, never
# ran on a GPU before).
# a: issue 8's recorded command ($OUT/spec.txt), then spark_variants.py at batch 1: none, draft-model,
#    deepspark, deepspark speculating every round, in turns ($OUT/variants.txt).
# b: the gpu-marked tests of the models, plugins and core ($OUT/gpu_tests.txt), and the CUDA spec
#    tests, each file in its own process ($OUT/cuda_spec_tests.txt).
# all: b's gpu-marked tests, then a's recorded command (one call, for when machines are scarce).
. benchmarks/h200_common.sh
EVERY='ds-every=deepspark:{"deepspark": {"skip_when_slower": "never"}}'
spec() { timeout 250 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
  --repeats 5 2>&1 | filter > "$OUT/spec.txt"; }
variants() { timeout "$1" python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --prompts 16 \
  --repeats 3 none= dm=draft-model ds=deepspark "$EVERY" 2>&1 | filter > "$OUT/variants.txt"; }
gpu_tests() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core \
  > "$OUT/gpu_tests.txt" 2>&1; }
spec_tests() {
  for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
    timeout 80 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
  done
}
case "${1:-a}" in
  all) gpu_tests; spec ;;
  a) spec; variants 200 ;;
  b) gpu_tests; spec_tests ;;
esac
