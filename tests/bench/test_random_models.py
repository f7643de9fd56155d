"""Random models are written directly (config.json and safetensors, no transformers), load in
transformers as the same model, and `bench` without transformers runs or says what to install."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepinfer.bench.models import build_random_model

SMALL = {"num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 256}
NO_TRANSFORMERS = "import sys; sys.modules['transformers'] = None; from deepinfer.cli import main; sys.exit(main({}))"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["llama-tiny", "qwen3-tiny", "deepseek-v3-tiny"])
def test_a_random_model_is_the_same_model_in_transformers(tmp_path, shape):
    """Oracle: transformers loads every tensor (none missing, none unused) and its greedy tokens are ours."""
    from transformers import AutoModelForCausalLM

    from deepinfer import LLM, SamplingParams

    path = build_random_model(shape, out=str(tmp_path), **SMALL)
    hf, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    assert not any(info.values()), info
    ids = [5, 17, 42, 99, 3]
    with torch.no_grad():
        for _ in range(6):  # greedy, one full forward a token
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    llm = LLM(path, device="cpu", progress=False)
    out = llm.generate({"prompt_token_ids": ids[:5]}, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                       use_tqdm=False)
    assert out[0].outputs[0].token_ids == ids[5:]


def test_random_weights_are_drawn_as_transformers_initialises_them(tmp_path):
    from safetensors.torch import load_file

    w = load_file(str(Path(build_random_model("qwen3-tiny", out=str(tmp_path), **SMALL)) / "model.safetensors"))
    assert torch.equal(w["model.norm.weight"], torch.ones(256))
    assert torch.equal(w["model.layers.0.self_attn.q_norm.weight"], torch.ones(64))
    std = w["model.layers.1.mlp.down_proj.weight"].std().item()
    assert abs(std - 0.02) < 0.001 and "lm_head.weight" not in w  # tied embeddings
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["torch_dtype"] == "float32"


def _bench_without_transformers(*args: str) -> subprocess.CompletedProcess:
    argv = ["bench", "latency", "--random-model", "llama-tiny", "--device", "cpu", "--repeats", "1",
            "--batch", "1", "--input-len", "8", "--output-len", "4", *args]
    return subprocess.run([sys.executable, "-c", NO_TRANSFORMERS.format(argv)], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.slow
def test_bench_on_a_random_model_runs_without_transformers():
    res = _bench_without_transformers()
    assert res.returncode == 0, res.stderr[-2000:]
    assert "deepinfer bench latency: 1 requests, 8 prompt + 4 output tokens" in res.stdout


def test_peer_hf_without_transformers_says_what_to_install():
    res = _bench_without_transformers("--peer", "hf")
    assert res.returncode == 2
    assert res.stderr == ("deepinfer: error: --peer hf runs Hugging Face transformers, which is not installed: "
                          "pip install 'deepinfer[bench]'\n")


def test_the_deepseek_v2_lite_shape_is_the_released_config():
    from deepinfer.bench.models import random_config
    from tests.models.test_deepseek_config import V2_LITE

    cfg = random_config("deepseek-v2-lite", "bfloat16")
    assert {k: cfg[k] for k in V2_LITE} == V2_LITE
