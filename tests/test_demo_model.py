"""The embedded demo pair: loadable by transformers, equal greedy tokens, losses as its card says."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import deepinfer
from deepinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow  # the embedded demo model, whole

PROMPTS = ["import os\n", "def read_config(path):\n", "class Stack:\n    def __init__(self):\n"]
ROOT = Path(__file__).resolve().parents[1]
# Drafts accepted a round of 5 in the replay below (8 held-out prompts, 48 new tokens): the shipped
# draft (self-distilled) 1.06, the draft it replaced (distilled on the corpus only) 0.68.
ACCEPTED_PER_ROUND_FLOOR = 0.9


@pytest.fixture(scope="module", params=["target", "draft"])
def pair_member(request):
    return deepinfer.DEMO_MODEL if request.param == "target" else deepinfer.DEMO_DRAFT_MODEL


def test_demo_directories_are_hugging_face_model_directories():
    for path in (deepinfer.DEMO_MODEL, deepinfer.DEMO_DRAFT_MODEL):
        p = Path(path)
        assert (p / "config.json").is_file() and (p / "tokenizer.json").is_file() and (p / "README.md").is_file()
        cfg = json.loads((p / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["dtype"] == "bfloat16"
    target = json.loads((Path(deepinfer.DEMO_MODEL) / "config.json").read_text())
    assert set(target["layer_types"]) == {"sliding_attention", "full_attention"}
    weights = sum(f.stat().st_size for d in (deepinfer.DEMO_MODEL, deepinfer.DEMO_DRAFT_MODEL)
                  for f in Path(d).glob("*.safetensors"))
    assert weights <= 40_000_000


def test_transformers_greedy_equals_deepinfer(pair_member):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair_member)
    model = AutoModelForCausalLM.from_pretrained(pair_member, dtype=torch.float32).eval()
    llm = LLM(pair_member, dtype="float32", progress=False)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert ids[0].tolist() == out.prompt_token_ids
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert out.outputs[0].token_ids == ref
        assert out.outputs[0].text == tok.decode(ref)


def test_train_demo_defaults_build_the_shipped_architectures():
    """`train-demo`'s default recipe reproduces the shipped pair's shapes (so that its log and
    cards describe the files), and bad sizes are refused before anything is trained."""
    from deepinfer.tools import demo_models, train_demo

    args = train_demo.parse_args([])
    built = {"target": demo_models.target_config(),
             "draft": demo_models.draft_config(args.draft_layers, args.draft_mlp)}
    log = json.loads((Path(deepinfer.DEMO_MODEL).parent / "train_log.json").read_text())
    for role, path in (("target", deepinfer.DEMO_MODEL), ("draft", deepinfer.DEMO_DRAFT_MODEL)):
        shipped = json.loads((Path(path) / "config.json").read_text())
        keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "layer_types")
        assert {k: getattr(built[role], k) for k in keys} == {k: shipped[k] for k in keys}, role
    assert log["training"]["draft"]["self_distillation"]["new_tokens"] == args.self_distill_new
    assert (log["settings"]["draft_steps"], log["settings"]["self_distill"]) == (args.draft_steps, args.self_distill)
    for flag in ("--draft-layers", "--draft-mlp", "--self-distill-new"):
        with pytest.raises(SystemExit):
            train_demo.parse_args([flag, "0"])


def test_train_demo_refuses_a_draft_too_large_for_the_pair_before_training(tmp_path):
    import shutil

    from deepinfer.tools import train_demo

    out = tmp_path / "pair"
    shutil.copytree(Path(deepinfer.DEMO_MODEL).parent, out)
    before = sorted((p.name, p.stat().st_size) for p in (out / "demo-draft").iterdir())
    with pytest.raises(SystemExit, match="over the 40 MB the pair may take: ask for a smaller draft"):
        train_demo.main(["--draft-only", "--device", "cpu", "--out", str(out), "--draft-layers", "4"])
    assert sorted((p.name, p.stat().st_size) for p in (out / "demo-draft").iterdir()) == before


def test_llm_without_model_uses_the_demo_model():
    llm = LLM(progress=False)
    assert llm.engine.ctx.model_path == deepinfer.DEMO_MODEL
    out = llm.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=4, temperature=0))
    assert out[0].prompt == "<|user|>hello<|end|>\n<|assistant|>"


def _heldout_sample(max_files: int = 6, max_chars: int = 6000) -> list[str]:
    """Standard-library files of this interpreter that the training split held out."""
    from deepinfer.tools.demo_data import collect_corpus

    corpus = collect_corpus()
    texts = [t[:max_chars] for t in corpus.heldout_texts if len(t) > 2000]
    assert len(texts) >= max_files
    return texts[:max_files]


def _loss(path: str, texts: list[str]) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([tok(text).input_ids[:512]])
        with torch.no_grad():
            out = model(ids, labels=ids)
        total += out.loss.item() * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    return total / count


def test_heldout_loss_far_below_uniform():
    # the distilled draft may come out a little below its (overfitted) target on held-out text
    texts = _heldout_sample()
    target, draft = _loss(deepinfer.DEMO_MODEL, texts), _loss(deepinfer.DEMO_DRAFT_MODEL, texts)
    uniform = math.log(8192)
    assert max(target, draft) < 0.6 * uniform and abs(target - draft) < 0.5, (target, draft, uniform)


def test_draft_model_speculation_is_the_greedy_replay_and_the_draft_is_accepted():
    """The engine's draft-model drafter (float32) accepts exactly the drafts that a replay of
    greedy speculative decoding with transformers' models accepts, position by position; and the
    shipped draft is accepted often enough to be worth running (its card gives the figures)."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from deepinfer.tools.demo_data import collect_corpus, heldout_prompt_ids
    from deepinfer.tools.demo_distill import speculative_acceptance

    k, new_tokens = 5, 48
    tok = Tokenizer.from_file(str(Path(deepinfer.DEMO_MODEL) / "tokenizer.json"))
    prompts = torch.tensor(heldout_prompt_ids(collect_corpus().heldout_texts, 8, 64,
                                              lambda text: tok.encode(text, add_special_tokens=False).ids))
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()
    replay = speculative_acceptance(load(deepinfer.DEMO_MODEL), load(deepinfer.DEMO_DRAFT_MODEL), prompts,
                                    new_tokens, k, "cpu")
    llm = LLM(dtype="float32", progress=False, plugins=["draft-model"])
    llm.generate([{"prompt_token_ids": p} for p in prompts.tolist()],
                 SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    m = llm.get_metrics()
    assert m["deepinfer:spec_decode_num_drafts"] == replay["rounds"]
    assert [m.get(f"deepinfer:spec_decode_num_accepted_tokens_pos_{i}", 0) for i in range(k)] == \
        replay["accepted_by_position"]
    assert replay["accepted_per_round"] > ACCEPTED_PER_ROUND_FLOOR, replay


@pytest.mark.slow
def test_wheel_carries_the_model_files_and_installs_with_them(tmp_path):
    wheel_dir = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheel_dir), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next(wheel_dir.glob("deepinfer-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for d in ("demo-target", "demo-draft"):
        assert f"deepinfer/assets/{d}/config.json" in names and f"deepinfer/assets/{d}/tokenizer.json" in names
    assert any(n.startswith("deepinfer/assets/demo-target/model-") for n in names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    code = ("import deepinfer, pathlib; from deepinfer import LLM, SamplingParams; "
            f"assert deepinfer.DEMO_MODEL.startswith({str(site)!r}); "
            "print(LLM(progress=False).generate('import os', SamplingParams(max_tokens=3, temperature=0), "
            "use_tqdm=False)[0].outputs[0].token_ids)")
    res = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(site), "PATH": ""},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout.strip().splitlines()[-1])) == 3
