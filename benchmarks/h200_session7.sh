# H200, session 7 (issue 8: a draft self-distilled from the demo target), one call each:
#   run(command="bash benchmarks/h200_session7.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
draft_variant() {  # NAME, then train-demo options: a new draft for the shipped target
  local name=$1; shift
  rm -rf "/tmp/$name" && cp -r deepinfer/assets "/tmp/$name"
  timeout 480 python3 -m deepinfer.tools.train_demo --draft-only --device cuda --out "/tmp/$name" \
    --eval-every 500 --log-every 250 "$@" > "$OUT/$name.log" 2>&1
  mkdir -p "$OUT/$name" && cp -r "/tmp/$name/demo-draft" "/tmp/$name/train_log.json" "$OUT/$name/"
}
if [ "${1:-a}" = a ]; then
  # the shipped draft's replayed acceptance, then two recipes side by side (the models are tiny)
  timeout 120 python3 - > "$OUT/shipped.txt" 2>&1 <<'PY'
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
import deepinfer
from deepinfer.tools import demo_data, demo_distill
tok = Tokenizer.from_file(f"{deepinfer.DEMO_MODEL}/tokenizer.json")
corpus = demo_data.collect_corpus()
load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda().eval()
prompts = torch.tensor(demo_data.heldout_prompt_ids(corpus.heldout_texts, 64, 64,
                                                  lambda t: tok.encode(t, add_special_tokens=False).ids))
print(demo_distill.speculative_acceptance(load(deepinfer.DEMO_MODEL), load(deepinfer.DEMO_DRAFT_MODEL),
                                          prompts, 128, 5, "cuda"))
PY
  draft_variant kl3k_self8k --draft-steps 3000 --distill-alpha 0 --self-distill 8192 &
  draft_variant kl4k_self16k --draft-steps 4000 --distill-alpha 0 --self-distill 16384 &
  wait
fi
if [ "${1:-a}" = b ]; then
  # the draft that ships: train-demo's defaults (the recipe a chose), only the files that change
  rm -rf /tmp/final && cp -r deepinfer/assets /tmp/final
  timeout 560 python3 -m deepinfer.tools.train_demo --draft-only --device cuda --out /tmp/final 2>&1 | \
    grep --line-buffered -v -e Warning -e forward_call -e deprecated > "$OUT/final.log"
  mkdir -p "$OUT/final" && cp /tmp/final/demo-draft/model.safetensors /tmp/final/demo-draft/README.md \
    /tmp/final/train_log.json "$OUT/final/" && cp /tmp/final/demo-target/README.md "$OUT/final/target_README.md"
fi
if [ "${1:-a}" = c ]; then
  # the shipped pair evaluated again with the final replay (its log and cards), the GPU tests of
  # speculative decoding, and bench spec with the new draft
  rm -rf /tmp/ev && cp -r deepinfer/assets /tmp/ev
  timeout 120 python3 -m deepinfer.tools.train_demo --evaluate-only --device cuda --out /tmp/ev 2>&1 | tail -3 \
    > "$OUT/evaluate.log"
  mkdir -p "$OUT/ev" && cp /tmp/ev/train_log.json "$OUT/ev/" && cp /tmp/ev/demo-draft/README.md "$OUT/ev/draft_README.md" \
    && cp /tmp/ev/demo-target/README.md "$OUT/ev/target_README.md"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 300 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 2>&1 | filter \
    > "$OUT/spec.txt"
fi
if [ "${1:-a}" = d ]; then
  # a greedy round's draft steps after the first from one graph (loop_graph): the GPU tests of
  # the speculative graphs, bench spec, and deepspark choosing its verified drafts in graphs
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 240 python3 -m deepinfer.cli bench spec --device sm90 --batch 1,64 --output-len 256 --repeats 3 2>&1 | filter \
    > "$OUT/spec.txt"
  timeout 80 python3 -m deepinfer.cli bench spec --device sm90 --drafters deepspark --batch 1,64 --output-len 256 \
    --repeats 3 --plugin-options '{"deepspark": {"verify_all_in_graphs": false}}' 2>&1 | filter > "$OUT/spec_choose.txt"
fi
if [ "${1:-a}" = e ]; then
  # where a speculative round's time goes with the loop graph: batch 1 (none, draft-model,
  # deepspark) and batch 64 (draft-model, deepspark)
  cd benchmarks
  timeout 200 python3 h200_spec_profile.py --out "$OUT/b1" --drafters none,draft-model,deepspark --batch 1 \
    --output-len 256 > "$OUT/b1.log" 2>&1
  timeout 150 python3 h200_spec_profile.py --out "$OUT/b64" --drafters draft-model,deepspark --batch 64 \
    --output-len 256 > "$OUT/b64.log" 2>&1
fi
if [ "${1:-a}" = f ]; then
  # the loop graph with the round's first step inside it (k steps a replay): GPU tests, bench spec
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/test_graphs.py \
    tests/plugins/test_spec_decode.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 python3 -m deepinfer.cli bench spec --device sm90 --drafters none,draft-model,deepspark --batch 1,64 \
    --output-len 256 --repeats 3 2>&1 | filter > "$OUT/spec.txt"
fi
