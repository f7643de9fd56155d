# H200, session 20, one call each:
#   run(command="bash benchmarks/h200_session20.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # deepspark's lookup (on by default) and the ngram drafter's incremental index: the gpu-marked
  # tests of the plugins and the core; then lookup off against on, alternating twice, at batch 1 and 64
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2; do
    for lk in false true; do
      echo "== lookup $lk (run $r)" >> "$OUT/lookup.txt"
      drafters=none,deepspark
      [ "$r$lk" = 1true ] && drafters=none,deepspark,ngram
      timeout 100 python3 -m deepinfer.cli bench spec --device sm90 --drafters $drafters --batch 1,64 \
        --output-len 256 --repeats 3 --plugin-options "{\"deepspark\": {\"lookup\": $lk}}" \
        2>&1 | filter >> "$OUT/lookup.txt"
    done
  done
fi
if [ "${1:-a}" = b ]; then
  # the final code (since call a: deepspark's table records a verification's drafts only up to the
  # first rejected one; lookup off in graphs by default): the gpu-marked tests and issue 8's
  # recorded command
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = c ] || [ "${1:-a}" = e ]; then
  # c: the loop graph's first step takes up to k + 1 tokens where deepspark's lookup is on in graphs,
  # and a longer catch-up computes its surplus eagerly before the loop (after a prompt, after
  # lookups); the gpu-marked tests first. e: lookup rounds chosen by their measured rate against the
  # model's (lookup.py). Both: lookup off against on, alternating twice, at batch 1 and 64
  [ "$1" = c ] && timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core \
    > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2; do
    lookup_off_on " (run $r)"
  done
fi
if [ "${1:-a}" = d ]; then
  # the final code: issue 8's recorded command
  timeout 330 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = f ]; then
  # the final code: the gpu-marked tests of the plugins and the core
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
fi
