# Session 50: run(command="bash benchmarks/h200_session50.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=300).
# The CPU kernel's AMX path on the GPU host's CPU (another Xeon): its CPU flags, the kernel's tests
# (each build this CPU runs, AMX's where it has it), and the kernel alone (cpu_amx_ab.py --kernel-only).
. benchmarks/h200_common.sh
grep -m1 "model name" /proc/cpuinfo > "$OUT/cpu.txt"
grep -m1 -o -w -e amx_tile -e amx_bf16 -e avx512_bf16 /proc/cpuinfo | sort -u >> "$OUT/cpu.txt"
nproc >> "$OUT/cpu.txt"
[ "${1:-a}" = a ] && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_cpu_bf16_kernel.py -rs > "$OUT/kernel_tests.txt" 2>&1
[ "${1:-a}" = a ] && timeout 100 python3 benchmarks/cpu_amx_ab.py --kernel-only > "$OUT/amx.txt" 2>&1
# b: the kernel alone at 1-16 threads (call a found AMX slower than VDPBF16PS at 16 threads for one row)
[ "${1:-a}" = b ] && timeout 200 python3 benchmarks/cpu_amx_ab.py --kernel-only --threads 1,2,4,8,16 > "$OUT/amx.txt" 2>&1
# c: b after the AMX path's cap of 4 threads
[ "${1:-a}" = c ] && timeout 200 python3 benchmarks/cpu_amx_ab.py --kernel-only --threads 2,4,8,16 > "$OUT/amx.txt" 2>&1
[ "${1:-a}" = c ] && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_cpu_bf16_kernel.py > "$OUT/kernel_tests.txt" 2>&1
