"""Ranks started by a launcher (torchrun: env:// rendezvous) run `deepinfer generate` together: rank 0
prints the single-process engine's tokens, and every rank exits 0."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
