# Session 48 (an H100 was lent for nvidia-h200): run(command="bash benchmarks/h200_session48.sh a",
# kind="nvidia-h200", carry=[".whl"], timeout_s=600). a: the gpu-marked tests and CUDA spec tests
# (h200_session47.sh b), then batch 1 with deepspark skipping (plain rounds measured against
# speculative ones) at batch 1 too, beside its defaults.
. benchmarks/h200_common.sh
case "${1:-a}" in
  a) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
       timeout 120 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
     done
     timeout 150 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 5 none= dm=draft-model \
       ds=deepspark 'ds-skip1=deepspark:{"deepspark": {"skip_min_batch": 1}}' 2>&1 | filter > "$OUT/b1.txt" ;;
  # b: batch 1 variants of the skipping at batch 1 ($2: extra JSON options merged into each deepspark row)
  b) timeout 250 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --repeats 7 none= ds=deepspark \
       'ds-skip1=deepspark:{"deepspark": {"skip_min_batch": 1}}' \
       'ds-skip1-m05=deepspark:{"deepspark": {"skip_min_batch": 1, "skip_margin": 0.05}}' 2>&1 | filter > "$OUT/b1.txt" ;;
esac
# c: acceptance of speculative rounds after plain steps against every round speculating
# (spark_catchup.py), then issue 8's recorded command with skip_min_batch's new default (1 in graphs)
case "${1:-a}" in
  c) for args in "--plain 0" "--plain 8 --spec 8"; do
       timeout 80 python3 benchmarks/spark_catchup.py --device sm90 $args 2>&1 | filter | tail -1 >> "$OUT/catchup.txt"
     done
     timeout 280 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 5 2>&1 \
       | filter > "$OUT/spec.txt" ;;
  # d: the gpu-marked tests and the CUDA spec tests (as in a) on the final code
  d) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     for t in tests/plugins/test_spec_distribution.py tests/plugins/test_spec_context_end.py; do
       timeout 120 python3 -m pytest -q -p no:cacheprovider "$t" >> "$OUT/cuda_spec_tests.txt" 2>&1
     done ;;
esac
