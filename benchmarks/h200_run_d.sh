# H200 run D: GPU engine tests and speculative decoding on the demo pair (after the KV-budget fix).
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_triton_attn.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
timeout 100 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 2>&1 | tail -8 | tee "$OUT/spec.txt"
