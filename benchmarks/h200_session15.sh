# H200, session 15, one call each:
#   run(command="bash benchmarks/h200_session15.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # session 14's final decode attention (the early table read a compile-time choice), never run on
  # a GPU: its kernel tests compiled and every gpu-marked test; the recorded issue-6 batch-1
  # command; the nano-vllm throughput workload (pass 2 now merges per kv head), deepinfer only
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py > "$OUT/tests.txt" 2>&1
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  timeout 110 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 2>&1 | filter > "$OUT/throughput.txt"
fi
if [ "${1:-a}" = b ]; then
  # (ran before a7d5b49, with the prefill graphs' first default token counts: 16, 32, 48, then
  # multiples of 64 up to 1,024)
  # prefill graphs (steps of one sequence computing many tokens, replayed): every gpu-marked test; the first token by
  # prompt length with and without them; the recorded batch-1 command interleaved with
  # --cuda-graph-prefill-sizes none
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_prefill_graphs.py > "$OUT/prefill_graphs.txt" 2>&1
  for r in 1 2; do
    echo "== prefill graphs" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== none" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 --cuda-graph-prefill-sizes none 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = c ]; then
  # (ran at a7d5b49 plus a change to CUDAGraphs.capture, removed after: captures after a set's
  # first skipped torch.cuda.graph's garbage collection and cache emptying, which did not shorten
  # the start-up; and with 19 default prefill token counts, now 9)
  # start-up time and memory; the graph tests; the first token by prompt length; the recorded
  # batch-1 command twice; a step's device time by kernel
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_prefill_graphs.py \
    tests/plugins/test_graphs.py tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 benchmarks/h200_prefill_graphs.py 2>&1 | filter > "$OUT/prefill_graphs.txt"
  for r in 1 2; do
    timeout 60 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
  (cd benchmarks && timeout 100 python3 h200_step_trace.py llama-1b > "$OUT/trace_log.txt" 2>&1)
fi
if [ "${1:-a}" = d ]; then
  # a batch-1 step's glue: timed without its input copy
  timeout 120 python3 benchmarks/h200_step_glue.py 2>&1 | filter > "$OUT/glue.txt"
fi
if [ "${1:-a}" = e ]; then
  # two changes for batch 1: decode attention reads the lengths and block tables before its PDL
  # wait (they are the step's inputs); replays of small batches read their inputs from pinned host
  # memory in their first kernel (stage_inputs) instead of a copy before the replay. The kernel
  # tests compiled and every gpu-marked test; 16 attention launches and 16 layers against the
  # kernel before (benchmarks/paged_attention_s14.py, a copy made for this call, not committed);
  # the recorded batch-1 command, interleaved: both changes, without staging, without either
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_placeholders.py \
    tests/kernels/test_paged_attention.py > "$OUT/tests.txt" 2>&1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 90 python3 h200_attn_ab.py --old paged_attention_s14.py --ctx 640 > "$OUT/attn_log.txt" 2>&1)
  V="python3 benchmarks/h200_latency_variant.py"
  for r in 1 2; do
    echo "== both" >> "$OUT/latency.txt"
    timeout 60 $LAT --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== no staging" >> "$OUT/latency.txt"
    timeout 60 $V --no-stage -- ${LAT#python3 -m deepinfer.cli} --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
    echo "== neither" >> "$OUT/latency.txt"
    timeout 60 $V --no-stage --attention benchmarks/paged_attention_s14.py -- ${LAT#python3 -m deepinfer.cli} \
      --repeats 2 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
fi
if [ "${1:-a}" = f ]; then
  # the final code: the nano-vllm throughput workload; the recorded issue-8 command (interleaved);
  # the batch-1 LM head as cuBLAS after the norm kernel against the GEMV kernel with the norm folded
  timeout 110 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 2 2>&1 | filter > "$OUT/throughput.txt"
  timeout 170 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/bench_spec.txt"
  (cd benchmarks && timeout 80 python3 h200_lm_head.py > "$OUT/lm_head.txt" 2>&1)
fi
if [ "${1:-a}" = g ]; then
  # call f's no drafter ran 2,383 tok/s at batch 1 and 41,149 at 64 on the demo pair (session 14
  # call g: 3,742 and 63,039): bench spec without a drafter, interleaved, with this session's
  # changes, without staging, without prefill graphs, without either
  V="python3 benchmarks/h200_latency_variant.py"
  S="bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 --drafters none"
  for r in 1 2; do
    echo "== as is" >> "$OUT/spec_none.txt"
    timeout 45 python3 -m deepinfer.cli $S 2>&1 | filter | grep -e "^none" >> "$OUT/spec_none.txt"
    echo "== no staging" >> "$OUT/spec_none.txt"
    timeout 45 $V --no-stage -- $S 2>&1 | filter | grep -e "^none" >> "$OUT/spec_none.txt"
    echo "== no prefill graphs" >> "$OUT/spec_none.txt"
    timeout 45 python3 -m deepinfer.cli $S --cuda-graph-prefill-sizes none 2>&1 | filter | grep -e "^none" >> "$OUT/spec_none.txt"
    echo "== neither" >> "$OUT/spec_none.txt"
    timeout 45 $V --no-stage -- $S --cuda-graph-prefill-sizes none 2>&1 | filter | grep -e "^none" >> "$OUT/spec_none.txt"
  done
fi
if [ "${1:-a}" = h ]; then
  # (not run: too little of the session's GPU time was left to start a machine)
  # the LM head of a one-row step through the single-token GEMV (call f: 120.6 against cuBLAS's
  # 127.7 us): the recorded batch-1 command twice, then every gpu-marked test
  for r in 1 2; do
    timeout 50 $LAT --repeats 3 2>&1 | filter | grep -e "tok/s" -e "first" >> "$OUT/latency.txt"
  done
  timeout 95 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
fi
