"""Ranks started by a launcher (torchrun: env:// rendezvous) run `deepinfer generate` together: rank 0
prints the single-process engine's tokens, and every rank exits 0."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serve.conftest import free_port
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow  # two ranks, each importing torch and building its shard
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
def test_torchrun_ranks_give_the_single_process_engines_tokens(tmp_path):
    from deepinfer import LLM, SamplingParams

    make_model(tmp_path, "qwen3")
    prompt = "The quick brown fox"
    one = LLM(str(tmp_path), device="cpu", dtype="float32", progress=False)
    want = one.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids
    one.shutdown()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    run = subprocess.run([TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "deepinfer.cli",
                          "generate", str(tmp_path), "--device", "cpu", "--dtype", "float32",
                          "--tensor-parallel-size", "2", "--prompt", prompt, "--max-tokens", "8", "--ignore-eos",
                          "--json"], check=False, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()  # (rank 1 prints nothing)
    assert json.loads(line)["token_ids"] == want


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
def test_torchrun_expert_parallel_ranks_give_the_single_process_engines_tokens(tmp_path):
    """Data-parallel attention with the experts sharded over a launcher's two ranks: two prompts, one a rank."""
    from deepinfer import LLM, SamplingParams

    make_model(tmp_path, "deepseek_v3", n_group=2, topk_group=1)
    prompts = ["The quick brown fox", "import os"]
    one = LLM(str(tmp_path), device="cpu", dtype="float32", progress=False)
    want = [o.outputs[0].token_ids for o in one.generate(prompts, SamplingParams(temperature=0, max_tokens=8,
                                                                                 ignore_eos=True), use_tqdm=False)]
    one.shutdown()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    run = subprocess.run([TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "deepinfer.cli",
                          "generate", str(tmp_path), "--device", "cpu", "--dtype", "float32", "--data-parallel-size",
                          "2", "--enable-expert-parallel", "--prompt", prompts[0], "--prompt", prompts[1],
                          "--max-tokens", "8", "--ignore-eos", "--json"], check=False, capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert [json.loads(line)["token_ids"] for line in run.stdout.splitlines()] == want


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
def test_torchrun_ranks_serve_the_single_process_engines_text_from_rank_0(tmp_path):
    """docs/architecture.md's two-host example on one host: rank 0 opens the HTTP port, rank 1 serves it."""
    import httpx

    from deepinfer import LLM, SamplingParams
    from tests.parallel.test_serve import _alive, _descendants

    make_model(tmp_path, "llama", num_key_value_heads=1)
    prompt = "The quick brown fox"
    one = LLM(str(tmp_path), device="cpu", progress=False)
    want = one.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    one.shutdown()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.Popen([TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                             "deepinfer.cli", "serve", str(tmp_path), "--device", "cpu", "--tensor-parallel-size", "2",
                             "--port", str(port), "--served-model-name", "tp"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
            "model": "tp", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.json()["choices"][0]["text"] == want
        below = _descendants(proc.pid)
        assert len(below) >= 3  # (the two ranks and rank 0's engine process)
    finally:
        proc.send_signal(signal.SIGTERM)  # (torchrun passes it on; rank 1 waits for rank 0 to stop it)
        proc.wait(60)
    time.sleep(1)
    assert not any(_alive(p) for p in below)
