"""`deepinfer serve --data-parallel-size 2 --enable-expert-parallel`: the single-process engine's text
(the oracle), streamed and whole, two requests at once (one a rank), from a DeepSeek-V3 whose experts are sharded over two ranks; the
server's metrics (which read the expert load summed over the ranks) and its exit leave no process;
a rank that dies ends the server with an error naming it and a non-zero exit."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.parallel.test_serve import _alive, _descendants, _spawned
from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow  # a real server with two ranks


def test_completions_give_the_single_process_engines_text(tmp_path):
    import openai

    from deepinfer import LLM, SamplingParams
    from tests.tiny_models import make_model

    make_model(tmp_path, "deepseek_v3", n_group=2, topk_group=1)
    prompts = ["The quick brown fox", "import os"]
    one = LLM(str(tmp_path), device="cpu", progress=False, max_model_len=256)
    want = [o.outputs[0].text for o in one.generate(prompts, SamplingParams(temperature=0, max_tokens=12,
                                                                            ignore_eos=True), use_tqdm=False)]
    one.generate(prompts[0], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    routed = int(one.expert_load().sum())
    one.shutdown()
    srv = ServerProcess(str(tmp_path), "--served-model-name", "ep", "--max-model-len", "256", "--device", "cpu",
                        "--data-parallel-size", "2", "--enable-expert-parallel")
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=60)
        args = {"model": "ep", "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(prompt=prompts, **args)  # (two requests at once: one a rank)
        streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=prompts[0], stream=True,
                                                                                 **args))
        assert [c.text for c in sorted(whole.choices, key=lambda c: c.index)] == want
        assert streamed == want[0]
        assert srv.metrics()["deepinfer:moe_routed_tokens"] == routed  # (the same requests, every rank's count)
        below = _descendants(srv.proc.pid)
        assert len(below) >= 2  # (the engine process and rank 1)
    finally:
        assert srv.stop() == 0, srv.output()
    time.sleep(1)
    left = [(p, Path(f"/proc/{p}/cmdline").read_bytes()) for p in below if _alive(p)]
    assert not left


def test_a_killed_rank_ends_the_server_with_an_error_naming_it(tmp_path):
    from tests.tiny_models import make_model

    make_model(tmp_path, "deepseek_v3", n_group=2, topk_group=1)
    srv = ServerProcess(str(tmp_path), "--served-model-name", "ep", "--max-model-len", "256", "--device", "cpu",
                        "--data-parallel-size", "2", "--enable-expert-parallel")
    try:
        below = _descendants(srv.proc.pid)
        (engine,) = _spawned(srv.proc.pid)
        (rank1,) = _spawned(engine)
        os.kill(rank1, signal.SIGKILL)
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"model": "ep", "prompt": "hi", "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 500 and "data-parallel rank 1" in r.text, r.text
        srv.proc.wait(60)
    finally:
        code = srv.stop()
    assert code == 1
    assert f"data-parallel rank 1 (pid {rank1}) died: killed by signal SIGKILL" in srv.output()
    time.sleep(0.5)
    assert not any(_alive(p) for p in below)
