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
