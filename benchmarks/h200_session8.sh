# H200, session 8 (issue 8: drafts left on the device for the verification), one call each:
#   run(command="bash benchmarks/h200_session8.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
SPEC="python3 -m deepinfer.cli bench spec --device sm90 --output-len 256 --repeats 3 --isolate"
if [ "${1:-a}" = a ]; then
  # GPU tests of the speculative graphs; bench spec with each drafter in a process of its own;
  # the same without device drafts (device_drafts off); a profile of batch-1 rounds
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 $SPEC --drafters none,draft-model,deepspark --batch 1,64 2>&1 | filter > "$OUT/spec.txt"
  for d in draft-model deepspark; do
    timeout 70 $SPEC --drafters $d --batch 1,64 --plugin-options "{\"$d\": {\"device_drafts\": false}}" 2>&1 | \
      filter > "$OUT/spec_host_drafts_$d.txt"
  done
  cd benchmarks
  timeout 100 python3 h200_spec_profile.py --out "$OUT/b1" --drafters none,deepspark --batch 1 \
    --output-len 256 > "$OUT/b1.log" 2>&1
fi
if [ "${1:-a}" = b ]; then
  # after the verification's rows became a view (no wait for the step before queuing its LM head):
  # GPU tests; bench spec in fresh processes, deepspark twice (an order effect shows as a gap
  # between its two rows), then deepspark without device drafts
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 $SPEC --repeats 5 --drafters none,deepspark,draft-model,deepspark --batch 1,64 2>&1 | filter > "$OUT/spec.txt"
  timeout 90 $SPEC --repeats 5 --drafters deepspark --batch 1,64 \
    --plugin-options '{"deepspark": {"device_drafts": false}}' 2>&1 | filter > "$OUT/spec_host_drafts.txt"
fi
if [ "${1:-a}" = c ]; then
  # drafters compared inside one process, runs interleaved (h200_spec_ab.py): batch 1 and 64
  cd benchmarks
  timeout 200 python3 h200_spec_ab.py --batch 1 --drafters none,draft-model,deepspark --runs 9 2>&1 | filter \
    > "$OUT/ab_b1.txt"
  timeout 150 python3 h200_spec_ab.py --batch 64 --prompts 64 --drafters none,draft-model,deepspark --runs 9 2>&1 | \
    filter > "$OUT/ab_b64.txt"
  timeout 120 python3 h200_spec_ab.py --batch 1 --drafters deepspark,deepspark+host --runs 9 2>&1 | filter \
    > "$OUT/ab_b1_host_drafts.txt"
fi
if [ "${1:-a}" = d ]; then
  # batch 1 again, with no drafter both with and without overlap scheduling (none moved from 0.87 s
  # to 1.4-2.1 s a run between calls, the drafters much less), 15 interleaved runs
  cd benchmarks
  timeout 300 python3 h200_spec_ab.py --batch 1 --drafters none,none+sync,deepspark,draft-model --runs 15 2>&1 | \
    filter > "$OUT/ab_b1.txt"
  nproc >> "$OUT/ab_b1.txt"; cat /proc/loadavg >> "$OUT/ab_b1.txt"
fi
if [ "${1:-a}" = e ]; then
  # after the review (HostCopy shared by the deferred samples and the draft round): GPU tests of the
  # graphs, speculative decoding and overlap; one bench spec at batch 1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py tests/core tests/plugins/test_triton_attn.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 $SPEC --drafters none,deepspark --batch 1 2>&1 | filter > "$OUT/spec.txt"
fi
