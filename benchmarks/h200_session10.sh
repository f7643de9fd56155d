# H200, session 10, one call each:
#   run(command="bash benchmarks/h200_session10.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # session 9's changes not yet run on the GPU: the GPU tests of core, graphs, speculative decoding,
  # argmax and in-replay placeholders; deepspark at batch 1 with the host-written draft loop graph
  # (interleaved against no drafter and draft-model); a profile of one batch-1 generate per drafter
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py tests/core/test_graph_placeholders.py \
    >> "$OUT/gpu_tests.txt" 2>&1
  (cd benchmarks && timeout 180 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark,draft-model --runs 5 2>&1 | \
    filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 150 python3 h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 128 \
    --drafters none,deepspark > "$OUT/prof_log.txt" 2>&1)
fi
if [ "${1:-a}" = b ]; then
  # where the first token's 14.9 ms go at batch 1 (Llama-3.2-1B shape): a timeline of the first
  # steps with overlap on and off; the prefill's device time and host profile (one-token generate)
  (cd benchmarks && timeout 120 python3 h200_first_steps.py --overlap 1 > "$OUT/first_steps_overlap.txt" 2>&1)
  (cd benchmarks && timeout 120 python3 h200_first_steps.py --overlap 0 > "$OUT/first_steps_sync.txt" 2>&1)
  (cd benchmarks && timeout 150 python3 h200_ttft_profile.py > "$OUT/ttft_log.txt" 2>&1)
fi
# c: ran at commit 540b951 (dropped after): kernels launched with PDL letting their successor launch at
#    their start (_launch.EARLY_TRIGGER), through benchmarks/h200_with_flags.py and
#    h200_flag_equal.py of that commit: the same bits, a step's device time kernel by kernel, batch 1
#    interleaved (off / on)
if [ "${1:-a}" = d ]; then
  # why a batch-1 prefill's launch takes 13.3 ms on the host with overlap and 8.1 ms (device wait
  # included) without (call b): cProfile of the prefill launches in both modes
  (cd benchmarks && timeout 200 python3 h200_prefill_launch.py > "$OUT/prefill_log.txt" 2>&1)
fi
if [ "${1:-a}" = e ]; then
  # the draft loop graph's confidences from one fused kernel (argmax_prob) instead of a float copy,
  # a softmax and a max a step: its kernel test compiled, the GPU tests of graphs and speculative
  # decoding, deepspark at batch 1 interleaved against no drafter, a profile of a batch-1 generate
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_argmax.py > "$OUT/tests.txt" 2>&1
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py >> "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 180 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark --runs 7 2>&1 | \
    filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 120 python3 h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 128 \
    --drafters deepspark > "$OUT/prof_log.txt" 2>&1)
fi
if [ "${1:-a}" = f ]; then
  # the final code: batch 1 of issue 6; bench spec at batch 1 and 64 (verified and accepted drafts)
  timeout 60 $LAT --repeats 3 2>&1 | filter > "$OUT/latency.txt"
  timeout 400 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --drafters none,draft-model,deepspark \
    --output-len 256 --repeats 3 2>&1 | filter > "$OUT/spec.txt"
fi
if [ "${1:-a}" = g ]; then
  # verification steps without a one-token run replay graphs without attention's decode pass (six
  # kernels a layer fewer): GPU tests of graphs and speculative decoding; batch 1 interleaved (none,
  # deepspark, draft-model) and 64 (draft-model, deepspark); a profile of a batch-1 generate
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/tests.txt" 2>&1
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 1 --drafters none,deepspark,draft-model --runs 7 2>&1 | \
    filter > "$OUT/ab_b1.txt")
  (cd benchmarks && timeout 150 python3 h200_spec_ab.py --batch 64 --prompts 64 --drafters draft-model,deepspark \
    --runs 5 2>&1 | filter > "$OUT/ab_b64.txt")
  (cd benchmarks && timeout 120 python3 h200_spec_profile.py --out "$OUT/prof" --batch 1 --output-len 128 \
    --drafters deepspark > "$OUT/prof_log.txt" 2>&1)
fi
if [ "${1:-a}" = h ]; then
  # the final code: every gpu-marked test of the repository
  # (tests/serve needs the openai client, which the GPU machine lacks; no gpu test there)
  timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serve > "$OUT/gpu_tests.txt" 2>&1
fi
