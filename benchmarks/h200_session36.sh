# H200, session 36:
#   run(command="bash benchmarks/h200_session36.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
R1='{"sm90": {"gemv_rows": 1}}'
case "${1:-a}" in
  # a: the multi-row GEMVs (steps of 2-16 tokens: verifications at batch 1, small decode batches):
  # their bf16 kernel tests and the gpu-marked tests, then no drafter, draft-model and deepspark with
  # them and without (gemv_rows 1: cuBLAS and the separate kernels, as before) at batch 1 and 8
  a) timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gemv_rows.py \
       tests/kernels/test_gemv.py > "$OUT/kernel_tests.txt" 2>&1
     issue8_tests_and_spec
     timeout 300 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1,8 --repeats 5 none= \
       "none-r1=:$R1" dm=draft-model "dm-r1=draft-model:$R1" ds=deepspark "ds-r1=deepspark:$R1" \
       2>&1 | filter > "$OUT/variants.txt" ;;
  # b: issue 8's recorded command, then the three at 64 requests with and without (verifications
  # of 64 x 6 rows keep cuBLAS: nothing should change there), then each graph's device time at
  # batch 1 and 8 (k = 5) with and without
  b) timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
       --repeats 5 2>&1 | filter > "$OUT/spec.txt"
     timeout 250 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 64 --repeats 5 none= \
       dm=draft-model ds=deepspark "ds-r1=deepspark:$R1" 2>&1 | filter > "$OUT/variants64.txt"
     for o in '{}' "$R1"; do
       echo "== options $o" >> "$OUT/depth.txt"
       timeout 60 python3 benchmarks/h200_depth_cost.py --ks 5 --batches 1,8 --options "$o" 2>&1 | filter >> "$OUT/depth.txt"
     done ;;
  # c: a larger model's small decode batches (Llama-3.2-1B's shape, random weights, bf16) at 4 and
  # 16 sequences with the multi-row GEMVs and without, twice interleaved
  c) for r in 1 2; do for o in '{}' "$R1"; do for b in 4 16; do
       echo "== batch $b options $o" >> "$OUT/llama1b.txt"
       timeout 45 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
         --batch $b --input-len 512 --output-len 128 --repeats 2 --kv-cache-memory-gb 8 --plugin-options "$o" \
         2>&1 | filter | grep -e "tok/s" -e rror >> "$OUT/llama1b.txt"
     done; done; done ;;
  # d: where batch 1's time goes (the torch profiler's kernels and cProfile, no drafter and
  # draft-model), then call c once
  d) timeout 150 python3 benchmarks/h200_spec_profile.py --out "$OUT/prof" --drafters none,draft-model \
       --batch 1 --output-len 256 --top 25 2>&1 | filter > "$OUT/prof.txt"
     for o in '{}' "$R1"; do for b in 4 16; do
       echo "== batch $b options $o" >> "$OUT/llama1b.txt"
       timeout 45 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
         --batch $b --input-len 512 --output-len 128 --repeats 2 --kv-cache-memory-gb 8 --plugin-options "$o" \
         2>&1 | filter | grep -e "tok/s" -e rror >> "$OUT/llama1b.txt"
     done; done ;;
  # e: the multi-row GEMVs' tiles at Llama-3.2-1B's and the demo's shapes against cuBLAS (call d
  # found them 3x slower than cuBLAS in Llama-1B's steps of 4 and 16), after their bf16 tests
  e) timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gemv_rows.py \
       > "$OUT/kernel_tests.txt" 2>&1
     timeout 300 python3 benchmarks/h200_rows_tiles.py 2>&1 | filter > "$OUT/rows_tiles_log.txt" ;;
  # f: the final code (the rows kernels only for projections of at most 2^22 weights: Llama-1B
  # keeps cuBLAS): the gpu-marked tests, call c once, then issue 8's recorded command
  f) timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gemv_rows.py \
       > "$OUT/kernel_tests.txt" 2>&1
     for o in '{}' "$R1"; do for b in 4 16; do
       echo "== batch $b options $o" >> "$OUT/llama1b.txt"
       timeout 45 python3 -m deepinfer.cli bench latency --random-model llama-1b --dtype bfloat16 --device sm90 \
         --batch $b --input-len 512 --output-len 128 --repeats 2 --kv-cache-memory-gb 8 --plugin-options "$o" \
         2>&1 | filter | grep -e "tok/s" -e rror >> "$OUT/llama1b.txt"
     done; done
     issue8_tests_and_spec spec ;;
  # g: issue 8's recorded command alone (call f's host ran no drafter at half call b's rate)
  g) timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
       --repeats 5 2>&1 | filter > "$OUT/spec.txt" ;;
  # h: was it the host? no drafter and deepspark at batch 1 on this code, then on 1bf7dda (before
  # calls d-f's changes; a git worktree, installed in its place), then on this code again
  h) R=$PWD
     SV="python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 3 none= ds=deepspark"
     timeout 80 $SV 2>&1 | filter | grep -A1 "^  [nd]" > "$OUT/new.txt"
     git worktree add -q /tmp/old 1bf7dda && cd /tmp/old \
       && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1
     timeout 80 $SV 2>&1 | filter | grep -A1 "^  [nd]" > "$OUT/old.txt"
     cd "$R" && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1
     timeout 80 $SV 2>&1 | filter | grep -A1 "^  [nd]" > "$OUT/new2.txt" ;;
esac
