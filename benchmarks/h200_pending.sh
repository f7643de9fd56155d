# H200: measurements still pending at the end of session 3 (its GPU time ran out), in two calls:
#   run(command="bash benchmarks/h200_pending.sh a", carry=[".whl"], timeout_s=600)
#   run(command="bash benchmarks/h200_pending.sh b", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh. grep --line-buffered: when the device call's own limit kills the
# whole pipe, a plain grep loses the lines it has buffered.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
filter() { grep --line-buffered -v -e Writing -e "Loading weights"; }
if [ "${1:-a}" = a ]; then
  # issue 6: the bf16 kernel tests after session 3's last changes (split clamp, 64-key cap, rotary body)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/plugins/test_triton_attn.py \
    > "$OUT/gpu_kernel_tests.txt" 2>&1
  # issue 6: the throughput goal is a ratio to transformers run in the same call (its 64-request
  # subset takes about 140 s)
  timeout 400 python3 -m deepinfer.cli bench throughput --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --num-requests 256 --min-len 100 --max-len 1024 --repeats 1 --peer hf --peer-requests 64 --peer-repeats 1 \
    --plot "$OUT/throughput.png" 2>&1 | filter > "$OUT/throughput.txt"
elif [ "$1" = c ]; then
  # issue 8 (session 4): one-token runs in verification graphs, the draft's first steps on graphs
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py tests/kernels/test_triton_backend_layouts.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 \
    2>&1 | filter > "$OUT/spec.txt"
  timeout 200 python3 benchmarks/h200_spec_profile.py --out "$OUT/profile" 2>&1 | filter > "$OUT/profile.txt"
elif [ "$1" = d ] || [ "$1" = e ]; then
  # issue 8 (session 4): deepspark's round depth from measured costs, all drafts verified in graphs
  # (e: the same after the fix to its cost averages, without the GPU tests)
  [ "$1" = d ] && timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py tests/kernels/test_triton_backend_layouts.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
  for opts in '{"cost_aware": false}' '{"verify_all_in_graphs": false}'; do
    echo "deepspark $opts" >> "$OUT/spec_ablation.txt"
    timeout 80 python3 -m deepinfer.cli bench spec --device sm90 --drafters deepspark --batch 1,64 --output-len 128 \
      --repeats 5 --plugin-options "{\"deepspark\": $opts}" 2>&1 | filter | tail -2 >> "$OUT/spec_ablation.txt"
  done
elif [ "$1" = f ]; then
  # issue 8 (session 4), the recorded run: longer outputs than d and e, whose 0.1-0.7 s runs varied
  # by up to 60% between calls
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 \
    2>&1 | filter > "$OUT/spec.txt"
  for opts in '{"cost_aware": false}' '{"verify_all_in_graphs": false}'; do
    echo "deepspark $opts" >> "$OUT/spec_ablation.txt"
    timeout 80 python3 -m deepinfer.cli bench spec --device sm90 --drafters deepspark --batch 64 --output-len 256 \
      --repeats 5 --plugin-options "{\"deepspark\": $opts}" 2>&1 | filter | tail -1 >> "$OUT/spec_ablation.txt"
  done
elif [ "$1" = g ]; then
  # session 4's review fixes (in-graph decode pass over the flagged runs only) on the GPU
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_backend_layouts.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py >> "$OUT/gpu_tests.txt" 2>&1
  timeout 120 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,draft-model,deepspark --batch 64 \
    --output-len 256 --repeats 5 2>&1 | filter > "$OUT/spec.txt"
else
  # issue 8: draft and verification steps from CUDA graphs (written in session 3, never run on a GPU)
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 150 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 \
    2>&1 | filter > "$OUT/spec.txt"
  # issue 5: the prefix-cache benchmark with the Triton backend (now the CUDA default)
  timeout 90 python3 -m deepinfer.cli bench prefix --random-model qwen3-0.6b --dtype bfloat16 --device sm90 \
    --shared 8000 --unique 320 --num-requests 64 --repeats 3 --kv-cache-memory-gb 60 2>&1 | filter > "$OUT/prefix.txt"
  # issue 7: the second half of benchmarks/h200_swa.sh (a cut sliding-window pool)
  timeout 90 python3 -m deepinfer.cli bench swa --random-model qwen3-0.6b --window 2048 --dtype bfloat16 --device sm90 \
    --kv-cache-memory-gb 40 --context 32768 --turns 8 --conversations 8 --output-len 32 \
    --intervals 128 --max-num-batched-tokens 8192 --sliding-pool-blocks 4096 2>&1 | filter > "$OUT/swa_cut.txt"
fi
