# H200, session 44 (no device was lent in session 44: this is for the next session that has one):
#   run(command="bash benchmarks/h200_session44.sh a", carry=[".whl"], timeout_s=600), then b, then c
# after ../shared/gpu/wheels.sh.
# The session's changes: sampled drafts drawn together with their distributions left on the device
# (sample_rows), sampled requests verified together there (verify_batch), and draft-model's and
# deepspark's sampled_drafts option (greedy: sampled requests drafted by argmax, their rounds in the
# loop graph).
. benchmarks/h200_common.sh
SAMPLED="bench spec --device sm90 --drafters none,draft-model,deepspark --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
case "${1:-a}" in
  # a: the gpu-marked tests (the rejection sampler's and sample_rows' chi-square tests on CUDA,
  # sampled rounds in CUDA loop graphs among them), then where sampled batch-1 time goes
  a) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     timeout 200 python3 benchmarks/h200_sampled_profile.py > "$OUT/sampled_profile.txt" 2>&1 ;;
  # b: sampled speculative decoding with per-row drafts and verification (sampling_variant.py
  # --before 44), as now, and as now with argmax drafts, twice in turn
  b) GREEDY_DRAFTS='{"draft-model": {"sampled_drafts": "greedy"}, "deepspark": {"sampled_drafts": "greedy"}}'
     for r in 1 2; do
       echo "== before" >> "$OUT/sampled.txt"
       timeout 90 python3 benchmarks/sampling_variant.py --before 44 -- $SAMPLED 2>&1 | filter >> "$OUT/sampled.txt"
       echo "== now" >> "$OUT/sampled.txt"
       timeout 90 python3 -m deepinfer.cli $SAMPLED 2>&1 | filter >> "$OUT/sampled.txt"
       echo "== now, argmax drafts" >> "$OUT/sampled.txt"
       timeout 90 python3 -m deepinfer.cli $SAMPLED --plugin-options "$GREEDY_DRAFTS" 2>&1 | filter >> "$OUT/sampled.txt"
     done ;;
  # c: issue 8's recorded command (greedy) and the same sampled, with ngram too
  c) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt"
     timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 \
       --temperature 0.8 2>&1 | filter > "$OUT/spec_sampled.txt" ;;
esac
