# Session 55: run(command="bash benchmarks/h200_session55.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600).
# deepspark chooses the kind of a request alone (batch 1, none waiting) per request, held to its
# end and timed whole (plugins.md). For a and e, first save the code before it beside this script:
#   git show a696c11:plugins_builtin/drafters/deepspark/drafter.py > benchmarks/old_deepspark.py
#   git show a696c11:plugins_builtin/drafters/deepspark/round_rates.py > benchmarks/old_round_rates.py
# a: spark_variants.py at batch 1 (none, draft-model, deepspark, deepspark speculating every round),
#    issue 8's recorded command ($OUT/spec.txt), then deepspark as it was (the saved files copied over
#    plugins_builtin) against none, in a process of its own ($OUT/variants.txt).
# b: the gpu-marked tests of the models, plugins and core ($OUT/gpu_tests.txt), then spark_variants.py
#    at batch 1 again: none, deepspark, deepspark speculating every round ($OUT/variants.txt).
# c: issue 8's recorded command at batch 1 only, without ngram ($OUT/spec.txt).
# d: spark_variants.py at batch 1 over 32 prompts: none, draft-model, deepspark ($OUT/variants.txt).
# e: spark_choice_ab.py: none, deepspark, deepspark with the saved code's choice of kinds, deepspark
#    speculating every round, in turns in one process ($OUT/variants.txt).
. benchmarks/h200_common.sh
VAR="python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --prompts 16 --repeats 3"
EVERY='ds-every=deepspark:{"deepspark": {"skip_when_slower": "never"}}'
case "${1:-a}" in
  a) echo "== new" >> "$OUT/variants.txt"
     timeout 150 $VAR none= dm=draft-model ds=deepspark "$EVERY" 2>&1 | filter >> "$OUT/variants.txt"
     timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 \
       --repeats 5 2>&1 | filter > "$OUT/spec.txt"
     cp benchmarks/old_deepspark.py plugins_builtin/drafters/deepspark/drafter.py
     cp benchmarks/old_round_rates.py plugins_builtin/drafters/deepspark/round_rates.py
     echo "== old" >> "$OUT/variants.txt"
     timeout 120 $VAR none= ds=deepspark 2>&1 | filter >> "$OUT/variants.txt" ;;
  b) timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core > "$OUT/gpu_tests.txt" 2>&1
     timeout 120 $VAR none= ds=deepspark "$EVERY" 2>&1 | filter > "$OUT/variants.txt" ;;
  c) timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1 --drafters none,draft-model,deepspark \
       --output-len 256 --repeats 5 2>&1 | filter > "$OUT/spec.txt" ;;
  d) timeout 200 python3 benchmarks/spark_variants.py --device sm90 --kv-gb 2 --batch 1 --prompts 32 --repeats 3 \
       none= dm=draft-model ds=deepspark 2>&1 | filter > "$OUT/variants.txt" ;;
  e) timeout 110 python3 benchmarks/spark_choice_ab.py --old benchmarks/old_deepspark.py --device sm90 --kv-gb 2 \
       --batch 1 --prompts 16 --repeats 3 none= ds=deepspark ds-old=deepspark "$EVERY" 2>&1 | filter > "$OUT/variants.txt" ;;
esac
