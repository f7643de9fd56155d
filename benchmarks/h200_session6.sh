# H200, session 6 (issue 6, batch-1 decode: a whole-layer kernel tried, then two launches fewer a layer), one call each:
#   run(command="bash benchmarks/h200_session6.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # the fused layer's kernel tests compiled, its check against the reference, its time against
  # the chain of single-token kernels, and a tile sweep (ran at commit a65c2ad, which has the
  # layer kernel and benchmarks/h200_decode_layer.py; both were removed after: see docs/benchmarks.md)
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode_layer.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 300 python3 benchmarks/h200_decode_layer.py > "$OUT/layer_log.txt" 2>&1
fi
if [ "${1:-a}" = b ]; then
  # the qkv GEMV writing the KV cache and decode attention merging in pass 1 (single-token
  # steps): their kernel tests compiled, the benchmark with the fusion on and off, equality at batch 1
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_paged_attention.py \
    tests/kernels/test_kv_cache.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 50 $LAT --repeats 2 --plugin-options '{"triton": {"single_token_fusion": false}}' 2>&1 | filter \
    > "$OUT/latency_no_fusion.txt"
  timeout 120 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" llama-1b > "$OUT/equal_log.txt" 2>&1
fi
if [ "${1:-a}" = c ]; then
  # the GPU tests after b's fusion (graphs, speculative decoding's single-token draft steps), then
  # a shorter decode split for single-token steps (triton single_token_split) at batch 1
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_triton_attn.py \
    tests/plugins/test_graphs.py tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  for split in 128 64; do
    timeout 45 $LAT --repeats 2 --plugin-options "{\"triton\": {\"single_token_split\": $split}}" 2>&1 | filter \
      > "$OUT/latency_split$split.txt"
  done
fi
if [ "${1:-a}" = d ]; then
  # final figures with this session's defaults: batch 1 with the fusion on and off in one call,
  # offline throughput (batch > 1: nothing changed there), the demo pair at batch 1
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 50 $LAT --repeats 2 --plugin-options '{"triton": {"single_token_fusion": false}}' 2>&1 | filter \
    > "$OUT/latency_no_fusion.txt"
  timeout 110 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 2>&1 | filter > "$OUT/throughput.txt"
  timeout 80 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,deepspark --batch 1 --output-len 256 \
    --repeats 3 2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = e ]; then
  # weight tiles loaded two steps ahead (GemvConfig.prefetch 2). Ran at commit 7891c3b, which has
  # that option, a depth-2 variant in h200_gemv_chain.py and, after the chain, a second batch-1 run
  # at depth 2 had the chain chosen it; reverted after (depths 0, 1, 2: 650.8, 657.3, 658.1 us)
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_gemv_chain.py > "$OUT/chain_log.txt" 2>&1
  timeout 45 $LAT --repeats 3 2>&1 | filter > "$OUT/latency_depth1.txt"
fi
if [ "${1:-a}" = f ]; then
  # decode attention with PDL loads its first tile of older keys before waiting for the previous
  # kernel (ran at commit 4f88045; reverted after: 1,030.5 tok/s, no gain over call b's 1,030.1): the
  # attention tests compiled (PDL against a plain launch, bit for bit), batch 1, equality
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py > "$OUT/kernel_tests.txt" 2>&1
  timeout 45 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 120 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" llama-1b > "$OUT/equal_log.txt" 2>&1
fi
if [ "${1:-a}" = g ]; then
  # the final kernels compiled after the reverts and the counters' move (bf16 included)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py tests/kernels/test_gemv.py \
    tests/kernels/test_argmax.py tests/kernels/test_kv_cache.py > "$OUT/kernel_tests.txt" 2>&1
fi
