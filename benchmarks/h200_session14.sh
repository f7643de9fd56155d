# H200, session 14, one call each:
#   run(command="bash benchmarks/h200_session14.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # every gpu-marked test on main; the first GPU runs of deepspark's overlap_plain_rounds (session
  # 13, off by default) at 64 requests, interleaved, with 256 and with 1,024 new tokens
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 170 python3 h200_spec_ab.py --batch 64 --prompts 64 \
    --drafters draft-model,deepspark,deepspark+overlap,none --runs 3 2>&1 | filter > "$OUT/ab_b64.txt")
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 64 --prompts 64 --output-len 1024 \
    --drafters deepspark,deepspark+overlap,draft-model --runs 3 2>&1 | filter > "$OUT/ab_b64_1024.txt")
fi
