# H200, session 35:
#   run(command="bash benchmarks/h200_session35.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: decode replays' head graphs (the LM head and argmax of plain greedy steps in a graph of
  # their own): with and without them at 64 requests and at batch 1, no drafter and deepspark
  # beside draft-model, in one process; then the gpu-marked tests
  a) timeout 330 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64,1 --repeats 5 none= \
       none-nohead= dm=draft-model ds=deepspark ds-nohead=deepspark 2>&1 | filter > "$OUT/variants.txt"
     issue8_tests_and_spec ;;
  # b: after call a (head graphs: no drafter 1.95x faster at batch 1, above both drafters):
  # deepspark skipping at batch 1 too (skip_min_batch 1), with plain rounds overlapped or not, and
  # speculation's best at batch 1 with shallower rounds (draft-model k = 2 and 3)
  b) timeout 300 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1,64 --repeats 5 none= \
       dm=draft-model ds=deepspark 'ds-s1=deepspark:{"deepspark": {"skip_min_batch": 1}}' \
       'ds-s1-ov=deepspark:{"deepspark": {"skip_min_batch": 1, "overlap_plain_rounds": true}}' \
       'dm-k2=draft-model:{"draft-model": {"num_speculative_tokens": 2}}' \
       'dm-k3=draft-model:{"draft-model": {"num_speculative_tokens": 3}}' 2>&1 | filter > "$OUT/variants.txt" ;;
  # c: call b's configurations, then the gpu-marked tests and issue 8's recorded command, in one
  # call (two calls for b were refused)
  c) bash "$0" b
     issue8_tests_and_spec spec ;;
  # d: deepspark's plain rounds overlapped by default (overlap_plain_rounds, 1.16x at 64 in call
  # c): no drafter, draft-model and deepspark with and without it at 64, then the gpu-marked tests
  # and issue 8's recorded command on the final code
  d) timeout 200 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64 --repeats 7 none= \
       dm=draft-model ds=deepspark 'ds-sync=deepspark:{"deepspark": {"overlap_plain_rounds": false}}' \
       2>&1 | filter > "$OUT/variants.txt"
     issue8_tests_and_spec spec ;;
esac
