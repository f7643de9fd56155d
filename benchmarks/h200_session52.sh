# Session 52: run(command="bash benchmarks/h200_session52.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600).
# a: rows with penalties or a held-back EOS now sampled in the batch on the GPU too (sampler.adjusted):
# the sampler's tests (their CUDA cases), the gpu-marked tests of the core, then the demo target at
# 64 requests with penalties, the batched way and one row at a time on the host in turns.
. benchmarks/h200_common.sh
case "${1:-a}" in
  a) timeout 60 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py -rs > "$OUT/sampler_tests.txt" 2>&1
     timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core > "$OUT/gpu_core_tests.txt" 2>&1
     timeout 200 python3 benchmarks/penalised_sampling.py --device sm90 --turns 2 2>&1 | filter > "$OUT/penalised.txt" ;;
esac
# b: the same on the reviewed code (a step's penalties and held-back stop tokens reach the GPU in one
# pinned copy that waits for no queued work; the sampler's CUDA test checks that in sync debug mode)
case "${1:-a}" in
  b) timeout 60 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py -rs > "$OUT/sampler_tests.txt" 2>&1
     timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core > "$OUT/gpu_core_tests.txt" 2>&1
     timeout 200 python3 benchmarks/penalised_sampling.py --device sm90 --turns 2 2>&1 | filter > "$OUT/penalised.txt" ;;
esac
# c: the sampler's tests and the core's gpu-marked tests after b's failure (a held-back stop token
# masked by assigning a Python number: a copy that waited; now a value made on the device)
case "${1:-a}" in
  c) timeout 60 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py -rs > "$OUT/sampler_tests.txt" 2>&1
     timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core > "$OUT/gpu_core_tests.txt" 2>&1 ;;
esac
# d: after the penalties' tests moved from test_sampler.py into tests/core/test_penalties.py (calls a-c
# ran them in test_sampler.py): both files, their CUDA cases included
case "${1:-a}" in
  d) timeout 90 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py tests/core/test_penalties.py -rs > "$OUT/sampler_tests.txt" 2>&1 ;;
esac
