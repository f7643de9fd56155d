# H200, session 43:
#   run(command="bash benchmarks/h200_session43.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: the session's changes: the samplers draw by inverse CDF (every sampled request, the rejection
  # sampler, the draft's sampled drafts), the CPU draft's compiled step also returns its logits (CUDA
  # devices replay graphs instead), bench spec's --temperature. The gpu-marked tests, issue 8's
  # recorded command (greedy), then the same at temperature 0.8 with the draw as before
  # (sampling_variant.py; call a ran its first version, race_variant.py at 3f879c6, which undid only the draw) and as now
  a) issue8_tests_and_spec spec
     SAMPLED="bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
     timeout 150 python3 benchmarks/sampling_variant.py -- $SAMPLED 2>&1 | filter > "$OUT/spec_sampled_race.txt"
     timeout 150 python3 -m deepinfer.cli $SAMPLED 2>&1 | filter > "$OUT/spec_sampled.txt" ;;
  # b: the batched sampler on the device (and its gpu-marked test), then no drafter, sampled at
  # batches 1 and 64, as before the session (sampling_variant.py) and as now, twice in turn
  b) timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     PLAIN="bench spec --device sm90 --drafters none --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
     for r in 1 2; do
       echo "== before" >> "$OUT/plain.txt"
       timeout 100 python3 benchmarks/sampling_variant.py -- $PLAIN 2>&1 | filter | grep none >> "$OUT/plain.txt"
       echo "== now" >> "$OUT/plain.txt"
       timeout 100 python3 -m deepinfer.cli $PLAIN 2>&1 | filter | grep none >> "$OUT/plain.txt"
     done
     timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 \
       --temperature 0.8 2>&1 | filter > "$OUT/spec_sampled.txt" ;;
esac
