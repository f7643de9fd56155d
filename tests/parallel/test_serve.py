"""`deepinfer serve --tensor-parallel-size 2`: the single-process engine's text, and a rank that dies
ends the server with an error naming it, a non-zero exit and no process left."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow  # real servers, each with two ranks


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc: the server's engine process and its ranks)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.tiny_models import make_model

    path = tmp_path_factory.mktemp("serve-tp-llama")
    make_model(path, "llama", num_key_value_heads=1)
    return path


def test_completions_give_the_single_process_engines_text(llama_dir):
    import openai

    from deepinfer import LLM, SamplingParams

    prompt = "The quick brown fox"
    one = LLM(str(llama_dir), device="cpu", progress=False, max_model_len=256)
    want = one.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    one.shutdown()
    srv = ServerProcess(str(llama_dir), "--served-model-name", "tp", "--max-model-len", "256", "--device", "cpu",
                        "--tensor-parallel-size", "2")
    try:
        assert len(_descendants(srv.proc.pid)) >= 2  # (the engine process and rank 1)
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=60)
        args = {"model": "tp", "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(prompt=prompt, **args)
        streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **args))
        assert whole.choices[0].text == streamed == want
        below = _descendants(srv.proc.pid)
    finally:
        assert srv.stop() == 0, srv.output()
    time.sleep(1)
    left = [(p, Path(f"/proc/{p}/cmdline").read_bytes()) for p in below if _alive(p)]
    assert not left


def test_a_killed_rank_ends_the_server_with_an_error_naming_it(llama_dir):
    srv = ServerProcess(str(llama_dir), "--served-model-name", "tp", "--max-model-len", "256", "--device", "cpu",
                        "--tensor-parallel-size", "2")
    try:
        below = _descendants(srv.proc.pid)
        (engine,) = _spawned(srv.proc.pid)
        (rank1,) = _spawned(engine)
        os.kill(rank1, signal.SIGKILL)
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"model": "tp", "prompt": "hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 500 and "tensor-parallel rank 1" in r.text, r.text
        srv.proc.wait(60)
    finally:
        code = srv.stop()
    assert code == 1
    assert f"tensor-parallel rank 1 (pid {rank1}) died: killed by signal SIGKILL" in srv.output()
    time.sleep(0.5)
    assert not any(_alive(p) for p in below)


def _spawned(pid: int) -> list[int]:
    """The processes ``pid`` started with multiprocessing's spawn (not its resource tracker)."""
    def parent(p: int) -> int:
        return int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])

    return [p for p in _descendants(pid) if parent(p) == pid and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_a_size_the_model_cannot_split_ends_serve_non_zero_with_the_valid_sizes(llama_dir):
    import subprocess

    from tests.serve.conftest import ROOT, SERVE, free_port

    run = subprocess.run([*SERVE, str(llama_dir), "--device", "cpu", "--port", str(free_port()),
                          "--tensor-parallel-size", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 1
    assert "tensor_parallel_size 3 does not split LlamaForCausalLM evenly" in run.stderr
    assert "valid sizes: 1, 2, 4" in run.stderr
