# H200 run J (issue 8): deepspark (with early stop) against draft-model k=5 at 64 requests, in the
# last two minutes of the session's GPU time.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 75 python3 -m deepinfer.cli bench spec --device sm90 --drafters draft-model,deepspark --batch 64 \
  --output-len 64 --repeats 1 > "$OUT/spec64.txt" 2>&1
tail -5 "$OUT/spec64.txt"
