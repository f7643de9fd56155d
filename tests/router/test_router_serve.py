"""`deepinfer router` in front of two real `deepinfer serve` instances, through the openai client:
the same greedy text as an instance asked directly, streamed or not; a conversation's turns reach
one instance; a killed instance's requests fail with a 502, never hang, and the other still serves."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.serve.conftest import ROOT, ServerProcess, free_port
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow


class RouterProcess:
    """``deepinfer router`` in a subprocess, with its flags (``--instances``, or ``--prefill`` and ``--decode``)."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "deepinfer.cli", "router", *flags,
                                      "--port", str(self.port)], cwd=ROOT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the router did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tiny_model = tmp_path_factory.mktemp("router-qwen3")
    make_model(tiny_model, "qwen3")
    servers = [ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--plugins", "prefix-cache")
               for _ in range(2)]
    router = RouterProcess("--instances", ",".join(s.base_url for s in servers))
    yield servers, router
    router.stop()
    for s in servers:
        s.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_router_gives_an_instances_text_streamed_or_not(fleet):
    servers, router = fleet
    via, direct = _client(router.base_url), _client(servers[0].base_url)
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    messages = [{"role": "user", "content": "Paged attention keeps the KV cache in fixed-size blocks. " * 3}]
    want = direct.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    chat_want = direct.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                               temperature=0).choices[0].message.content
    got = via.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    assert got == want
    stream = via.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == want
    chat = via.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == chat_want
    stream = via.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == chat_want


def test_a_conversation_stays_on_its_instance(fleet):
    _, router = fleet
    messages = [{"role": "user", "content": "def read_config(path): with open(path) as f: return f.read() " * 3}]
    homes = set()
    for _ in range(3):
        r = httpx.post(router.base_url + "/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0})
        homes.add(r.headers["x-deepinfer-instance"])
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "and then what happens next?"}]
    assert len(homes) == 1


def test_a_killed_instance_fails_its_requests_with_a_502(fleet):
    servers, router = fleet
    servers[1].stop(signal.SIGKILL)
    via = _client(router.base_url)
    results = []
    for i in range(4):  # new prompts: spread over both instances
        try:
            via.completions.create(model="tiny", prompt=f"import os number {i} " * 20, max_tokens=4, temperature=0)
            results.append("ok")
        except openai.APIStatusError as e:
            assert e.status_code == 502 and servers[1].base_url in e.message
            results.append("502")
    assert sorted(set(results)) == ["502", "ok"]
