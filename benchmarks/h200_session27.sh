# H200, session 27, one call each:
#   run(command="bash benchmarks/h200_session27.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: the cpu plugin now defines the operator deepinfer::cpu_bf16_linear when imported, and the
  # draft's default dtype asks the device (CPU only): gpu-marked tests and issue 8's recorded command
  a) issue8_tests_and_spec spec ;;
  # b: after the review (Device.draft_dtype; the operator through torch.library's schema API): the
  # gpu-marked tests again, on the final code
  b) issue8_tests_and_spec ;;
esac
