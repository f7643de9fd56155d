# GPU host, session 53 (issue 8: two recipes for a third demo draft; neither shipped, docs/benchmarks.md),
#   run(command="bash benchmarks/h200_session53.sh a", kind="nvidia-h200", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh. Every candidate is a new draft for the shipped target (--draft-only). The
# call ran with train_demo.py's SELF_DISTILL_BATCH at 1,024 (512 before and after).
. benchmarks/h200_common.sh
draft_variant() {  # NAME, then train-demo options
  local name=$1; shift
  rm -rf "/tmp/$name" && cp -r deepinfer/assets "/tmp/$name"
  timeout 530 python3 -m deepinfer.tools.train_demo --draft-only --device cuda --out "/tmp/$name" "$@" 2>&1 | \
    grep --line-buffered -v -e Warning -e forward_call -e deprecated > "$OUT/$name.log"
  # (more than the 8 files a call brings back: only the logs and replay.txt came back)
  mkdir -p "$OUT/$name" && cp -r "/tmp/$name/demo-draft" "/tmp/$name/train_log.json" "$OUT/$name/"
}
replay() {  # the replayed acceptance of each draft directory given, at bench spec's 8 prompts x 256 tokens
  timeout 120 python3 - "$@" > "$OUT/replay.txt" 2>&1 <<'PY'
import sys
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
import deepinfer
from deepinfer.tools import demo_data, demo_distill
tok = Tokenizer.from_file(f"{deepinfer.DEMO_MODEL}/tokenizer.json")
corpus = demo_data.collect_corpus()
load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda().eval()
ids = lambda n: torch.tensor(demo_data.heldout_prompt_ids(corpus.heldout_texts, n, 64,
                                                          lambda t: tok.encode(t, add_special_tokens=False).ids))
target = load(deepinfer.DEMO_MODEL)
for d in sys.argv[1:]:
    draft = load(d)
    for n, new in ((8, 256), (64, 256), (64, 128)):
        r = demo_distill.speculative_acceptance(target, draft, ids(n), new, 5, "cuda")
        print(d, n, new, round(r["accepted_per_round"], 3), [round(a, 3) for a in r["acceptance_by_position"]])
PY
}
if [ "${1:-a}" = a ]; then
  # two recipes side by side (the models are tiny): continuations as long as bench spec's, with the
  # draft's two layers and with three, its MLP narrowed so that both models' weights stay under 40 MB
  draft_variant l2_new256 --self-distill-new 256 &
  draft_variant l3_new256 --self-distill-new 256 --draft-layers 3 --draft-mlp 640 &
  wait
  replay deepinfer/assets/demo-draft /tmp/l2_new256/demo-draft /tmp/l3_new256/demo-draft
fi
