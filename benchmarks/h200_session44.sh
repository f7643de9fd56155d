# H200, session 44 (no device was lent in session 44: this is for the next session that has one):
#   run(command="bash benchmarks/h200_session44.sh a", carry=[".whl"], timeout_s=600), then b, c, d
# after ../shared/gpu/wheels.sh.
# The session's changes: sampled drafts drawn together with their distributions left on the device
# (sample_rows), sampled requests verified together there (verify_batch), loop graphs for sampled
# rounds (sampled_loop), and the sampled_drafts option (greedy: sampled requests drafted by argmax).
. benchmarks/h200_common.sh
SAMPLED="bench spec --device sm90 --drafters none,draft-model,deepspark --batch 1,64 --output-len 256 --repeats 3 --temperature 0.8"
both() { echo "{\"draft-model\": {$1}, \"deepspark\": {$1}}"; }
# One turn of the sampled variants into $OUT/sampled.txt: as session 43 left them (per-row drafts
# and verification, step by step: sampling_variant.py --before 44), batched but step by step
# (sampled_loop false), batched in the sampled loop graphs (the defaults), argmax drafts in the
# greedy loop graph (sampled_drafts greedy)
sampled_turn() {
  echo "== before" >> "$OUT/sampled.txt"
  timeout 90 python3 benchmarks/sampling_variant.py --before 44 -- $SAMPLED --plugin-options "$(both '"sampled_loop": false')" \
    2>&1 | filter >> "$OUT/sampled.txt"
  echo "== batched, step by step" >> "$OUT/sampled.txt"
  timeout 90 python3 -m deepinfer.cli $SAMPLED --plugin-options "$(both '"sampled_loop": false')" 2>&1 | filter >> "$OUT/sampled.txt"
  echo "== batched, loop graphs" >> "$OUT/sampled.txt"
  timeout 90 python3 -m deepinfer.cli $SAMPLED 2>&1 | filter >> "$OUT/sampled.txt"
  echo "== argmax drafts" >> "$OUT/sampled.txt"
  timeout 90 python3 -m deepinfer.cli $SAMPLED --plugin-options "$(both '"sampled_drafts": "greedy"')" 2>&1 \
    | filter >> "$OUT/sampled.txt"
}
case "${1:-a}" in
  # a: the gpu-marked tests (the rejection sampler's and sample_rows' chi-square tests on CUDA,
  # sampled rounds in CUDA loop graphs against eager steps among them), then where sampled
  # batch-1 time goes
  a) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     timeout 200 python3 benchmarks/h200_sampled_profile.py > "$OUT/sampled_profile.txt" 2>&1 ;;
  # b, c: two turns of the sampled variants
  b|c) sampled_turn ;;
  # d: issue 8's recorded command (greedy) and the same sampled, with ngram too
  d) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt"
     timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 \
       --temperature 0.8 2>&1 | filter > "$OUT/spec_sampled.txt" ;;
esac
