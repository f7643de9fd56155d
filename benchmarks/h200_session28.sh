# H200, session 28, one call each:
#   run(command="bash benchmarks/h200_session28.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: the torch attention's metadata for equal-length decodes returns early; the CPU's bfloat16
  # kernel prefetches its weights and the CPU draft's compiled step skips guards (neither runs on
  # CUDA): gpu-marked tests and issue 8's recorded command
  a) issue8_tests_and_spec spec ;;
  # b: after the review (stale kernel builds, the guard-skipping stance's conditions; CPU code):
  # the gpu-marked tests again, on the final code
  b) issue8_tests_and_spec ;;
esac
