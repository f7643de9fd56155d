# H200, session 17, one call each:
#   run(command="bash benchmarks/h200_session17.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # (ran at dcc3ce0, reverted after) o_proj's GEMV merges decode attention's splits as it reads
  # them (paged_decode_attention_partials, the triton option merge_in_projection): the kernel tests
  # compiled; 16 layers against pass 1's merge (h200_merge_in_o.py); the recorded batch-1 command
  # interleaved with the option off
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv_partials.py \
    tests/kernels/test_paged_attention.py tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_merge_in_o.py > "$OUT/merge_in_o_log.txt" 2>&1)
  latency_vs "merged by o" "merge in pass 1" '{"triton": {"merge_in_projection": false}}'
fi
if [ "${1:-a}" = b ]; then
  # where the first token's 2.5 ms go: a timeline of the first steps (h200_first_steps.py), the
  # prefill's device time by kernel and the host's profile (h200_ttft_profile.py)
  (cd benchmarks && timeout 120 python3 h200_first_steps.py --overlap 1 > "$OUT/first_steps.txt" 2>&1)
  (cd benchmarks && timeout 150 python3 h200_ttft_profile.py > "$OUT/ttft_log.txt" 2>&1)
fi
if [ "${1:-a}" = c ]; then
  # the first layer's qkv GEMV reads the token's embedding row itself (no embedding kernel in a
  # one-token step): test_gemv.py compiled; every gpu-marked test; the recorded batch-1 command
  # interleaved with the embedding kernel (h200_latency_variant.py --no-qkv-embed); prefill
  # attention's tiles on four shapes (h200_prefill_tiles.py)
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/tests.txt" 2>&1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  latency_vs "qkv reads the embedding" "embedding kernel" --no-qkv-embed  # (a flag removed with the change)
  (cd benchmarks && timeout 120 python3 h200_prefill_tiles.py > "$OUT/prefill_log.txt" 2>&1)
fi
if [ "${1:-a}" = d ]; then
  # (ran at f0b4711, reverted after) decode attention reads its first split's keys and values
  # before its PDL wait: the kernel tests compiled (with the new gpu test of the race with the qkv
  # kernel's write); 16 layers against the keys read after the wait (h200_preload.py); the recorded
  # batch-1 command interleaved with the kernel before (benchmarks/paged_attention_s17.py, an
  # untracked copy for the call: git show 0c6b794:kernels/paged_attention.py)
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 120 python3 h200_preload.py > "$OUT/preload_log.txt" 2>&1)
  latency_vs "keys before the wait" "before (keys after the wait)" "--attention benchmarks/paged_attention_s17.py"
fi
if [ "${1:-a}" = e ]; then
  # decode attention's stages in one-token steps, and f0b4711's keys read before the wait with fewer
  # stages (h200_attn_stages.py; first: git show f0b4711:kernels/paged_attention.py >
  # benchmarks/paged_attention_preload_f0b4711.py, an untracked copy that the call takes along)
  (cd benchmarks && timeout 150 python3 h200_attn_stages.py > "$OUT/stages_log.txt" 2>&1)
fi
if [ "${1:-a}" = f ]; then
  # the final code: every gpu-marked test; the recorded batch-1 command twice; the recorded issue-8
  # command
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  for r in 1 2; do
    timeout 45 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" -e rror >> "$OUT/latency.txt"
  done
  timeout 250 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/bench_spec.txt"
fi
if [ "${1:-a}" = g ]; then
  # o_proj's registers, so that its programs can be resident beside decode attention's
  # (h200_o_regs.py); the refactored h200_merge_bound.py once
  (cd benchmarks && timeout 120 python3 h200_o_regs.py > "$OUT/o_regs_log.txt" 2>&1)
  (cd benchmarks && timeout 60 python3 h200_merge_bound.py --ctx 640 --trials 3 > "$OUT/merge_bound_log.txt" 2>&1)
fi
if [ "${1:-a}" = h ]; then
  # (ran at 4f7db5d, reverted after) the qkv GEMV pulls gate/up's first rows into the L2 while
  # attention runs (CUDA option l2_prefetch_mb, default 12): 16 layers by MB prefetched
  # (h200_l2_prefetch.py); the recorded batch-1 command interleaved with l2_prefetch_mb 0
  (cd benchmarks && timeout 100 python3 h200_l2_prefetch.py > "$OUT/l2_prefetch_log.txt" 2>&1)
  latency_vs "l2_prefetch_mb 12" "l2_prefetch_mb 0" '{"sm90": {"l2_prefetch_mb": 0}}'
fi
