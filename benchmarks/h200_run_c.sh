# H200 run C: GPU tests, triton vs torch at real shapes, speculative decoding on the demo pair.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_triton_attn.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
timeout 110 python3 benchmarks/h200_triton_equal.py "$OUT/triton_equal.md" 2>&1 | grep -v Writing | tail -6
timeout 100 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 128 --repeats 2 2>&1 | tail -8 | tee "$OUT/spec.txt"
