# H200, session 38:
#   run(command="bash benchmarks/h200_session38.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: the session's changes are to the CPU (the cpu device, the torch attention on the CPU, the
  # draft's compiled step) and to deepspark's round depth (depth_margin), which CUDA graphs'
  # loop rounds do not use: the gpu-marked tests and issue 8's recorded command on the final code
  a) issue8_tests_and_spec spec ;;
esac
