# H200, session 19, one call each:
#   run(command="bash benchmarks/h200_session19.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # after deepspark's min_value default went to 0.05 and the CPU's compiled draft step (off on CUDA
  # by default; in graphs deepspark's threshold is 0 anyway): the gpu-marked tests of the plugins and
  # the core; issue 8's recorded command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = b ]; then
  # deepspark's min_value at 0.25 (the default before) against 0.05 (the new default), beside
  # draft-model, at 64 requests and at batch 1, alternating twice
  for r in 1 2; do
    for mv in 0.25 0.05; do
      echo "== min_value $mv (run $r)" >> "$OUT/min_value.txt"
      timeout 140 python3 -m deepinfer.cli bench spec --device sm90 --drafters draft-model,deepspark --batch 1,64 \
        --output-len 256 --repeats 3 --plugin-options "{\"deepspark\": {\"min_value\": $mv}}" \
        2>&1 | filter >> "$OUT/min_value.txt"
    done
  done
fi
