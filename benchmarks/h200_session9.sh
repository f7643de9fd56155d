# H200, session 9 (issue 6: single-token GEMV tiles chosen in a decode step's chain), one call each:
#   run(command="bash benchmarks/h200_session9.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
if [ "${1:-a}" = a ]; then
  # GEMV programs that go on to further row blocks (GemvConfig.programs): the GEMV tests compiled,
  # the grid sweep (h200_gemv_persist.py), batch 1 with the defaults
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py > "$OUT/kernel_tests.txt" 2>&1
  (cd benchmarks && timeout 240 python3 h200_gemv_persist.py > "$OUT/persist_log.txt" 2>&1)
  timeout 45 $LAT --repeats 2 2>&1 | filter >> "$OUT/latency.txt"
fi
