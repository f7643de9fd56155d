# H200, session 34:
#   run(command="bash benchmarks/h200_session34.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: where a batch-1 step's host time goes for no drafter, draft-model and deepspark (wrapped
  # functions, h200_host_parts.py), and a speculative round's timeline on the host's clock
  # (h200_round_timeline.py), on session 33's final code
  a) for d in none draft-model deepspark; do
       timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --prompts 4 2>&1 | filter >> "$OUT/parts.txt"
     done
     for d in draft-model deepspark; do
       timeout 100 python3 benchmarks/h200_round_timeline.py --drafter $d --prompts 4 2>&1 | filter >> "$OUT/timeline.txt"
     done ;;
  # b: call a's host parts of deepspark again, with the verification step's parts between its
  # graph's replay and the chained round's (the LM head, argmax, host copies, on_verified)
  b) timeout 100 python3 benchmarks/h200_host_parts.py --drafter deepspark --prompts 4 2>&1 | filter >> "$OUT/parts.txt" ;;
  # c: the verification's LM head (144 us a call in call b): its norm and matmul timed apart, and
  # whether the device was still busy when each began
  c) timeout 100 python3 benchmarks/h200_logits_wait.py --prompts 4 2>&1 | filter > "$OUT/logits.txt" ;;
  # d: a launch's host cost by what is queued ahead of it (idle, a sleep kernel, a graph's replay)
  d) timeout 200 python3 benchmarks/h200_launch_behind.py 2>&1 | filter > "$OUT/launch.txt" ;;
  # e: after the verification graphs' greedy head (and the argmax on the logits as computed, the
  # loop round's one-kernel token conversion): deepspark's host parts, both drafters' round
  # timelines, then the gpu-marked tests and issue 8's recorded command
  e) timeout 100 python3 benchmarks/h200_host_parts.py --drafter deepspark --prompts 4 2>&1 | filter >> "$OUT/parts.txt"
     for d in draft-model deepspark; do
       timeout 100 python3 benchmarks/h200_round_timeline.py --drafter $d --prompts 4 2>&1 | filter >> "$OUT/timeline.txt"
     done
     issue8_tests_and_spec spec ;;
  # f: at 64 requests after call e (draft-model at no drafter's speed there): the drafters and
  # deepspark always speculating, and both at k = 3, in one process
  f) timeout 300 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64 none= dm=draft-model \
       ds=deepspark 'ds-spec=deepspark:{"deepspark": {"skip_when_slower": "never"}}' \
       'dm-k3=draft-model:{"draft-model": {"num_speculative_tokens": 3}}' \
       'ds-spec-k3=deepspark:{"deepspark": {"skip_when_slower": "never", "num_speculative_tokens": 3}}' \
       2>&1 | filter > "$OUT/variants.txt" ;;
  # g: the final code (call e's, with the test's new count of verifications that read the replay's
  # argmaxes): the gpu-marked tests and issue 8's recorded command again
  g) issue8_tests_and_spec spec ;;
  # h: at 64 requests deepspark's plain steps ran 14% below no drafter's (call g): with
  # overlap_plain_rounds (plain rounds keep overlap scheduling), against no drafter and draft-model
  h) timeout 300 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64 --repeats 7 none= \
       'none-sync=:{"fcfs": {"overlap": false}}' dm=draft-model ds=deepspark \
       'ds-overlap=deepspark:{"deepspark": {"overlap_plain_rounds": true}}' 2>&1 | filter > "$OUT/variants.txt" ;;
  # i: with the engine skipping deepspark's proposals while its plain steps are held to a closed
  # batch's end (Drafter.rests_above): call h's configurations, then the gpu-marked tests and
  # issue 8's recorded command on the final code
  i) timeout 200 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64 --repeats 7 none= \
       'none-sync=:{"fcfs": {"overlap": false}}' dm=draft-model ds=deepspark 2>&1 | filter > "$OUT/variants.txt"
     issue8_tests_and_spec spec ;;
esac
