# H200, session 46: run(command="bash benchmarks/h200_session46.sh a", carry=[".whl"], timeout_s=600),
# then b and c, after ../shared/gpu/wheels.sh.
# The session's changes: the draft's generator seeded apart from the request's, a drawn draft's
# confidence its distribution's top probability (in the sampled loop graphs too), drafts capped at
# the end of the context (and no chained round that would pass it).
. benchmarks/h200_common.sh
SAMPLED="bench spec --device sm90 --drafters none,draft-model,deepspark --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
case "${1:-a}" in
  # a: the gpu-marked tests; then on CUDA (device auto: graphs, loop graphs, chained rounds) the
  # end-to-end chi-square test of sampled speculation and the end-of-context test
  a) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     timeout 250 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_spec_distribution.py \
       tests/plugins/test_spec_decode.py -k "distribution or end_of_the_context or seeded" > "$OUT/cuda_spec_tests.txt" 2>&1 ;;
  # b: sampled, twice (the confidences of drawn drafts changed)
  b) for r in 1 2; do timeout 140 python3 -m deepinfer.cli $SAMPLED 2>&1 | filter >> "$OUT/spec_sampled.txt"; done ;;
  # c: issue 8's recorded command (greedy)
  c) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt" ;;
esac
