# H200, session 29, one call:
#   run(command="bash benchmarks/h200_session29.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: the CPU draft's compiled step builds its inputs without a StepBatch (torch attention's
  # sequence_metadata; not run on CUDA): gpu-marked tests and issue 8's recorded command
  a) issue8_tests_and_spec spec ;;
esac
