# H200, session 33:
#   run(command="bash benchmarks/h200_session33.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
VARIANTS="python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2"
case "${1:-a}" in
  # a: bench spec's order and workload (batch 1, then 64; 5 runs in turns) with where each
  # configuration's host time goes, deepspark with and without lookup; then cProfile of one
  # batch-1 generate of draft-model and of deepspark (deepspark was 10% behind draft-model at
  # batch 1 in session 32 with the same tokens a step and drafts verified)
  a) timeout 300 $VARIANTS --batch 1,64 none= 'none-sync=:{"fcfs": {"overlap": false}}' dm=draft-model \
       ds=deepspark 'ds-nolookup=deepspark:{"deepspark": {"lookup": false}}' 2>&1 | filter > "$OUT/variants.txt"
     timeout 200 python3 benchmarks/h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 256 --top 25 \
       2>&1 | filter > "$OUT/prof_log.txt" ;;
  # b: deepspark's runs at 64 one by one (its rounds' kinds in order, h200_spark_log.py), and
  # against every round forced plain and no drafter without overlap, in one process
  b) timeout 150 python3 benchmarks/h200_spark_log.py --runs 6 2>&1 | filter > "$OUT/spark_log.txt"
     timeout 200 python3 benchmarks/h200_plain_rounds.py --runs 7 none-sync draft-model deepspark plain \
       2>&1 | filter > "$OUT/plain_rounds.txt" ;;
  # c: after the host cuts (a request's parameters read once; deepspark's held plain steps; the
  # look's gap): call a's configurations in bench spec's order, then the gpu-marked tests and
  # issue 8's recorded command
  c) timeout 200 $VARIANTS --batch 1,64 none= 'none-sync=:{"fcfs": {"overlap": false}}' dm=draft-model \
       ds=deepspark 2>&1 | filter > "$OUT/variants.txt"
     issue8_tests_and_spec spec ;;
  # d: where deepspark's batch-1 rounds spend host time beyond draft-model's (the same tokens a
  # step and drafts verified, 5-7% slower in calls a and c): cProfile of one generate each
  d) timeout 200 python3 benchmarks/h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 256 --top 70 \
       2>&1 | filter > "$OUT/prof_log.txt" ;;
  # e: the final code (as call c's) again: issue 8's recorded command, then deepspark against
  # every round forced plain, no drafter without overlap and draft-model, in one process
  e) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
       2>&1 | filter > "$OUT/spec.txt"
     timeout 200 python3 benchmarks/h200_plain_rounds.py --runs 7 none-sync draft-model deepspark plain \
       2>&1 | filter > "$OUT/plain_rounds.txt" ;;
  # f: issue 8's recorded command a third time on the final code
  f) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
       2>&1 | filter > "$OUT/spec.txt" ;;
  # g: the final code (the review's change to the max_tokens scan after calls c-f): the gpu-marked
  # tests and issue 8's recorded command
  g) issue8_tests_and_spec spec ;;
esac
