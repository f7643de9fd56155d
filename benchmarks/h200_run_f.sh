# H200 run F: why a graph step takes what it takes (kernel table, bare replay), and the GPU graph test.
set -u
. benchmarks/h200_setup.sh > "$OUT/env.txt" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider -x -m gpu tests/plugins/test_graphs.py 2>&1 | tail -60 > "$OUT/gpu_graph_test.txt"
timeout 200 python3 benchmarks/h200_kernels_profile.py llama-1b 2>&1 | grep -v Writing | tail -5 | tee "$OUT/replay.txt"
