# Session 51: run(command="bash benchmarks/h200_session51.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600).
# a: the gpu-marked tests of the models, plugins and core, and the CUDA spec tests (each file in its
# own process), on the code with the sampler's new filtering (its CUDA path now gathers the softmax
# taken in vocabulary order); then the sampler's tests (their CUDA cases) and the CPU kernel's tests
# on this host's CPU and torch (its C++ operator built against this torch's headers).
. benchmarks/h200_common.sh
case "${1:-a}" in
  a) timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
       timeout 110 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
     done
     timeout 40 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py -rs > "$OUT/sampler_tests.txt" 2>&1
     timeout 60 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_cpu_bf16_kernel.py -rs > "$OUT/kernel_tests.txt" 2>&1 ;;
esac
# b: the CPU kernel's tests and its calls alone (cpu_native_op_ab.py --kernel-only) on the final code
# (the C++ operator built as C++20 and registered for every backend), then the sampler's tests
case "${1:-a}" in
  b) timeout 100 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_cpu_bf16_kernel.py -rs > "$OUT/kernel_tests.txt" 2>&1
     timeout 40 python3 -m pytest -q -p no:cacheprovider tests/core/test_sampler.py -rs > "$OUT/sampler_tests.txt" 2>&1
     timeout 90 python3 benchmarks/cpu_native_op_ab.py --kernel-only > "$OUT/native_op.txt" 2>&1 ;;
esac
