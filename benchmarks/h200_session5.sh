# H200, session 5 (issue 6, batch-1 decode through the single-token GEMV kernels), one call each:
#   run(command="bash benchmarks/h200_session5.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # the kernels compiled (float32, float16, bfloat16), then a tile sweep, then the benchmark with
  # the default tiles, with the GEMVs off, and the kernel profile of an eager step
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/gemv_tests.txt" 2>&1
  timeout 240 python3 benchmarks/h200_gemv_sweep.py > "$OUT/sweep_log.txt" 2>&1
  timeout 80 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 60 $LAT --repeats 2 --plugin-options '{"sm90": {"single_token_gemv": false}}' 2>&1 | filter \
    > "$OUT/latency_no_gemv.txt"
  timeout 90 python3 benchmarks/h200_kernels_profile.py llama-1b > "$OUT/kprof.txt" 2>&1
fi
if [ "${1:-a}" = b ]; then
  # the tile sweep alone (call a's stopped at a bug in the script's eager reference), and the
  # decode-attention split at batch 1
  timeout 300 python3 benchmarks/h200_gemv_sweep.py > "$OUT/sweep_log.txt" 2>&1
  timeout 60 $LAT --repeats 2 --plugin-options '{"triton": {"split_size": 64}}' 2>&1 | filter > "$OUT/latency_split64.txt"
fi
if [ "${1:-a}" = c ]; then
  # the sweep again, cycling through weight copies (call b's tiles read weights from L2), the
  # argmax kernel's tests and the benchmark with it
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py tests/kernels/test_gemv.py \
    > "$OUT/kernel_tests.txt" 2>&1
  timeout 400 python3 benchmarks/h200_gemv_sweep.py > "$OUT/sweep_log.txt" 2>&1
  timeout 60 $LAT --repeats 2 2>&1 | filter > "$OUT/latency.txt"
fi
if [ "${1:-a}" = d ]; then
  # tuned default tiles, weights read a tile ahead, programmatic dependent launch: kernel tests,
  # the 16-layer projection chain, the benchmark with PDL on and off, float32 equality at batch 1
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py tests/kernels/test_gemv.py \
    > "$OUT/kernel_tests.txt" 2>&1
  timeout 120 python3 benchmarks/h200_gemv_chain.py > "$OUT/chain_log.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 60 $LAT --repeats 2 --plugin-options '{"sm90": {"programmatic_launch": false}}' 2>&1 | filter \
    > "$OUT/latency_no_pdl.txt"
  timeout 200 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" > "$OUT/equal_log.txt" 2>&1
fi
if [ "${1:-a}" = e ]; then
  # call d's benchmark and equality runs again, after the fix to FusedOps (call d stopped there)
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 60 $LAT --repeats 2 --plugin-options '{"sm90": {"programmatic_launch": false}}' 2>&1 | filter \
    > "$OUT/latency_no_pdl.txt"
  timeout 200 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" > "$OUT/equal_log.txt" 2>&1
  timeout 90 python3 benchmarks/h200_kernels_profile.py llama-1b > "$OUT/kprof.txt" 2>&1
fi
if [ "${1:-a}" = f ]; then
  # the GPU tests with the GEMV path in place (graphs, speculative decoding's single-token draft
  # steps), throughput (batch > 1: the argmax kernel only) and the speculative-decoding benchmark
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_triton_attn.py \
    tests/plugins/test_graphs.py tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 110 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 2>&1 | filter > "$OUT/throughput.txt"
  timeout 150 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 \
    2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = g ]; then
  # weights a tile ahead or not: the kernel tests, the chain both ways; the faster becomes the
  # default (PREFETCH in kernels/gemv.py, set here the way the chain chose) for the benchmark
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_gemv_chain.py > "$OUT/chain_log.txt" 2>&1
  if grep -q "PREFETCH=False" "$OUT/gemv_chain.txt"; then sed -i 's/^PREFETCH = True/PREFETCH = False/' kernels/gemv.py; fi
  grep -n "^PREFETCH" kernels/gemv.py > "$OUT/prefetch_used.txt"
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
fi
if [ "${1:-a}" = h ]; then
  # the review fixes (a CTA barrier before the split-K release; whole-head tiles for the q/k
  # norm): compiled kernel tests, equality at batch 1 (Qwen3 takes the new tiles), the demo pair
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_argmax.py \
    > "$OUT/kernel_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" > "$OUT/equal_log.txt" 2>&1
  timeout 70 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,deepspark --batch 1 --output-len 256 \
    --repeats 3 2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = i ]; then
  # the KV write and decode attention also launched with PDL in single-token steps: their kernel
  # tests compiled, the benchmark with it on and off, equality at batch 1 (Llama shape)
  timeout 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py \
    tests/kernels/test_kv_cache.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 40 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 35 $LAT --repeats 2 --plugin-options '{"triton": {"programmatic_launch": false}}' 2>&1 | filter \
    > "$OUT/latency_attn_no_pdl.txt"
  timeout 100 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" llama-1b > "$OUT/equal_log.txt" 2>&1
fi
