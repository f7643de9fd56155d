# H200, session 32:
#   run(command="bash benchmarks/h200_session32.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: deepspark's plain rounds against no drafter's steps at 64 requests, in one process
  # (h200_plain_rounds.py), then every round's choice at 64 (h200_spark_log.py)
  a) timeout 300 python3 benchmarks/h200_plain_rounds.py --runs 7 2>&1 | filter > "$OUT/plain_rounds.txt"
     timeout 200 python3 benchmarks/h200_spark_log.py --runs 5 2>&1 | filter > "$OUT/spark_log.txt" ;;
  # b: the same after the change (where no request waits, the kinds compare by the time until
  # the batch is done), then the gpu-marked tests and issue 8's recorded command
  # (call b ran before the hook took the engine as a required argument: an H200's older pluggy
  # passes no argument that has a default, so the drains never ran there; call c after that,
  # and after a new batch's first rounds hold the last factor)
  b|c) timeout 200 python3 benchmarks/h200_plain_rounds.py --runs 7 none none-sync draft-model deepspark plain \
       2>&1 | filter > "$OUT/plain_rounds.txt"
     timeout 100 python3 benchmarks/h200_spark_log.py --runs 3 2>&1 | filter > "$OUT/spark_log.txt"
     issue8_tests_and_spec spec ;;
  # d: after plain steps chosen for a batch that nothing joins run to its end (no looks): the
  # same in one process, then the gpu-marked tests and issue 8's recorded command
  d) timeout 150 python3 benchmarks/h200_plain_rounds.py --runs 7 none-sync draft-model deepspark plain \
       2>&1 | filter > "$OUT/plain_rounds.txt"
     issue8_tests_and_spec spec ;;
esac
