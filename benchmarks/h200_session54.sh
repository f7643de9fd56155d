# Session 54: run(command="bash benchmarks/h200_session54.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600).
# a: bench spec now decodes 64 prompts at batch 1 by default (the ones a batch of 64 decodes; before,
# the first 8): issue 8's recorded command on the GPU ($OUT/spec.txt), then the gpu-marked tests of
# the models, plugins and core ($OUT/gpu_tests.txt).
. benchmarks/h200_common.sh
case "${1:-a}" in
  a) timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
       --repeats 5 2>&1 | filter > "$OUT/spec.txt"
     timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1 ;;
esac
