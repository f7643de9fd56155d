"""The `triton` attention plugin gives the `torch` backend's greedy tokens (the oracle), in the Triton
interpreter on the CPU and compiled on a GPU, and says clearly when it cannot run.

The interpreter runs in a subprocess: triton fixes its mode when first imported, so TRITON_INTERPRET=1
must be in the environment before the process starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.interpreter import run_interpreted

ROOT = Path(__file__).resolve().parents[2]
NEEDS = "needs an NVIDIA GPU, or TRITON_INTERPRET=1 to run in the Triton interpreter on CPU"


def _prompts(lengths: list[int]) -> list[list[int]]:
    return [[6 + (i * 7 + j * 13) % 300 for j in range(n)] for i, n in enumerate(lengths)]


def generate_both(model_dir: str, dtype: str, prompts: list[list[int]], max_tokens: int, logprobs: int | None = None,
                  triton_options: dict | None = None, **engine) -> dict:
    """Greedy outputs of the torch and triton backends, and the kinds of steps the triton one ran."""
    from deepinfer import LLM, SamplingParams
    from deepinfer_builtin.attention.triton_attn import TritonAttention

    kinds: Counter[str] = Counter()
    build = TritonAttention.build_metadata

    def counting(self, batch):
        meta = build(self, batch)
        kinds["decode" if meta.decode_only else "mixed" if meta.decode_rows is not None else "prefill"] += 1
        return meta

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    out = {}
    TritonAttention.build_metadata = counting
    try:
        for name in ("torch", "triton"):
            options = {"triton": triton_options} if name == "triton" and triton_options else {}
            llm = LLM(model_dir, plugins=[name], dtype=dtype, progress=False, plugin_options=options, **engine)
            res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            out[name] = [o.outputs[0].token_ids for o in res]
            if logprobs:
                out[name + "_logprobs"] = [[sorted(lp.values(), reverse=True)[:2] for lp in o.outputs[0].logprobs]
                                           for o in res]
    finally:
        TritonAttention.build_metadata = build
    out["kinds"] = dict(kinds)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from tests.tiny_models import hybrid, make_model

    path = tmp_path_factory.mktemp("qwen3-swa")
    make_model(path, "qwen3", **hybrid(12))
    return str(path)


def _child(args: list[str], interpret: bool) -> subprocess.CompletedProcess:
    if interpret:
        return run_interpreted(args)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.mark.slow
def test_interpreter_engine_gives_the_torch_backends_greedy_tokens(model_dir):
    res = _child(["-m", "tests.plugins.test_triton_attn", model_dir], interpret=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["triton"] == got["torch"]
    # prefill chunks after a cached prefix, one-token runs inside mixed steps, pure decode steps
    assert got["kinds"].get("prefill", 0) > 0 and got["kinds"].get("mixed", 0) > 0 and got["kinds"]["decode"] > 0
    assert "bfloat16 wrongly" in got["bf16_error"]
    alone = got["alone"]
    assert alone["triton"] == alone["torch"]
    assert alone["splits"] == {"1:16": alone["splits"]["1:16"]} and alone["splits"]["1:16"] > 0
    batched = got["batched_splits"]  # steps of several sequences keep split_size
    assert all(key.endswith(":16") for key in batched if not key.startswith("1:")) and len(batched) > 1


@pytest.mark.slow
def test_interpreter_engine_serves_latent_layers_with_the_torch_backends_tokens(tmp_path):
    """DeepSeek's latent (MLA) layers: the MLA decode kernel, the prefill kernel over whole rows and
    one-token runs in mixed steps give the torch backend's greedy tokens."""
    from tests.tiny_models import make_model

    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    res = _child(["-m", "tests.plugins.test_triton_attn", str(tmp_path), "latent"], interpret=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["triton"] == got["torch"]
    assert got["kinds"].get("prefill", 0) > 0 and got["kinds"].get("mixed", 0) > 0 and got["kinds"]["decode"] > 0


def test_unavailable_without_a_gpu_or_the_interpreter_says_what_it_needs():
    code = "from deepinfer_builtin.attention.triton_attn import TritonAttention as T; print(T.unavailable_reason())"
    res = _child(["-c", code], interpret=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == NEEDS


def test_unavailable_when_triton_cannot_be_imported(monkeypatch):
    from deepinfer_builtin.attention import triton_attn

    def missing():
        raise ModuleNotFoundError("No module named 'triton'")

    monkeypatch.setattr(triton_attn, "_kernels", missing)
    reason = triton_attn.TritonAttention.unavailable_reason()
    assert reason.startswith("triton cannot be imported") and "pip install triton" in reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_engine_gives_the_torch_backends_greedy_tokens(model_dir, dtype):
    prompts = _prompts([150, 300, 40, 513, 1, 77])
    # a fixed KV size: both engines live in this process, so the first must not take the whole GPU
    got = generate_both(model_dir, dtype, prompts, 24, logprobs=2, block_size=16, max_num_batched_tokens=256,
                        max_model_len=1024, kv_cache_memory_gb=1.0)
    assert got["kinds"].get("mixed", 0) > 0 and got["kinds"]["decode"] > 0
    for i, (ref, out) in enumerate(zip(got["torch"], got["triton"], strict=True)):
        if ref == out:
            continue
        step = next(j for j, (a, b) in enumerate(zip(ref, out, strict=True)) if a != b)
        top2 = got["torch_logprobs"][i][step]
        # only a near-tie of the reference's top two tokens may flip (bf16 sums in another order)
        assert dtype == "bfloat16" and top2[0] - top2[1] < 0.05, (i, step, top2)


def _main(model_dir: str) -> None:
    """Child of the interpreter test: prints the outputs of both backends as one JSON line."""
    engine = {"device": "cpu", "block_size": 4, "num_kv_blocks": 64, "max_model_len": 64,
              "max_num_batched_tokens": 24}
    # decode attention's split: single_token_split in steps of one token (one sequence alone), else
    # split_size (recorded as "rows:split" per call)
    import deepinfer_kernels

    splits: Counter[str] = Counter()
    decode = deepinfer_kernels.paged_decode_attention

    def recording(q, *args, **kwargs):
        splits[f"{q.shape[0]}:{args[8]}"] += 1
        return decode(q, *args, **kwargs)

    deepinfer_kernels.paged_decode_attention = recording
    out = generate_both(model_dir, "float32", _prompts([3, 17, 30, 9]), 8,
                        triton_options={"split_size": 16, "single_token_split": 32}, **engine)
    out["batched_splits"] = dict(splits)
    splits.clear()
    alone = generate_both(model_dir, "float32", _prompts([21]), 12,
                          triton_options={"split_size": 32, "single_token_split": 16}, **engine)
    deepinfer_kernels.paged_decode_attention = decode
    out["alone"] = {"torch": alone["torch"], "triton": alone["triton"], "splits": dict(splits)}
    from deepinfer import LLM

    try:
        LLM(model_dir, plugins=["triton"], dtype="bfloat16", progress=False, **engine)
        out["bf16_error"] = ""
    except ValueError as exc:
        out["bf16_error"] = str(exc)
    print(json.dumps(out))


def _main_latent(model_dir: str) -> None:
    """Child of the latent-layer test: both backends' tokens on a tiny DeepSeek-V3, as JSON."""
    engine = {"device": "cpu", "block_size": 4, "num_kv_blocks": 64, "max_model_len": 64,
              "max_num_batched_tokens": 24}
    print(json.dumps(generate_both(model_dir, "float32", _prompts([3, 17, 30, 9]), 6,
                                   triton_options={"split_size": 16}, **engine)))


if __name__ == "__main__":
    _main_latent(sys.argv[1]) if sys.argv[2:] == ["latent"] else _main(sys.argv[1])
