"""Building an engine and generating with it leave torch's compiler and sympy unimported: importing
them took 3.5 s of every process's start on a 2-core machine (each server, rank and CLI call).
Models are built on the meta device with torch.nn.init's initialisers skipped, rotary tables are
computed on the CPU and parameters made on the device directly: on meta tensors torch runs Python
decompositions whose first use imports them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tiny_models import make_model

CHILD = """
import json, sys
from deepinfer import LLM, SamplingParams
llm = LLM(sys.argv[1], progress=False, dtype="float32", num_kv_blocks=64, block_size=4, max_model_len=64)
out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
print(json.dumps([len(out[0].outputs[0].token_ids),
                  sorted(m for m in sys.modules if m.startswith("torch._dynamo") or m == "sympy")]))
"""


@pytest.mark.parametrize("arch, extra", [
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 256}}),
    ("qwen3", {}), ("deepseek_v2", {}),
    ("deepseek_v3", {"n_group": 2, "topk_group": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}),
])
def test_an_engine_starts_and_generates_without_importing_torchs_compiler_or_sympy(tmp_path, arch, extra):
    make_model(tmp_path, arch, with_tokenizer=False, **extra)
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    made, compiler = json.loads(res.stdout.strip().splitlines()[-1])
    assert made == 3 and compiler == []
