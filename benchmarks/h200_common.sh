# Sourced by the per-session H200 scripts: the setup (output to $OUT/env.txt), a filter for the
# benchmarks' progress lines, and the batch-1 decode command of issue 6. grep --line-buffered:
# when the device call's own limit kills the whole pipe, a plain grep loses the lines it has buffered.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
filter() { grep --line-buffered -v -e Writing -e "Loading weights"; }
LAT="python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 --batch 1 \
  --input-len 512 --output-len 256 --kv-cache-memory-gb 8"
# Batch 1 end to end, twice interleaved: the defaults, then the GEMV tiles of the
# JSON file $2 (h200_latency_with.py), labelled $1 in $OUT/latency.txt.
latency_ab() {
  for r in 1 2; do
    echo "== defaults" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== $1" >> "$OUT/latency.txt"
    timeout 60 python3 benchmarks/h200_latency_with.py "$2" -- ${LAT#python3 -m deepinfer.cli} \
      --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
}
# Batch 1 end to end, twice interleaved: the code as it is (labelled $1), then with the
# h200_latency_variant.py flags or the plugin options "$3" (labelled $2), in $OUT/latency.txt.
# $3 starting with "{": plugin options; otherwise the variant script's flags.
latency_vs() {
  for r in 1 2; do
    echo "== $1" >> "$OUT/latency.txt"
    timeout 40 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
    echo "== $2" >> "$OUT/latency.txt"
    case "$3" in
      "{"*) timeout 40 $LAT --repeats 2 --plugin-options "$3" 2>&1 ;;
      *) timeout 40 python3 benchmarks/h200_latency_variant.py $3 -- ${LAT#python3 -m deepinfer.cli} --repeats 2 2>&1 ;;
    esac | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
}
# deepspark's lookup off, then on: `bench spec --drafters none,deepspark --batch 1,64` each, into
# $OUT/lookup.txt under "== lookup false$1" and "== lookup true$1".
lookup_off_on() {
  for lk in false true; do
    echo "== lookup $lk$1" >> "$OUT/lookup.txt"
    timeout 100 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,deepspark --batch 1,64 \
      --output-len 256 --repeats 3 --plugin-options "{\"deepspark\": {\"lookup\": $lk}}" \
      2>&1 | filter >> "$OUT/lookup.txt"
  done
}
