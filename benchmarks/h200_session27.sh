# H200, session 27, one call each:
#   run(command="bash benchmarks/h200_session27.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # the cpu plugin now defines the operator deepinfer::cpu_bf16_linear when imported, and the draft's
  # default dtype asks the device for a linear op on the CPU only: the gpu-marked tests of the models,
  # plugins and core, and issue 8's recorded command
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = b ]; then
  # after the review (Device.draft_dtype; the operator through torch.library's schema API): the
  # gpu-marked tests of the models, plugins and core on the final code
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
fi
