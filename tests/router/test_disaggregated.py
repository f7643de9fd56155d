"""Prefill and decode instances behind the router, the KV handed over through the kv-store
directory: the greedy text of one colocated instance through the openai client, streamed or not,
with the decode instance reading the prompt's blocks from the store; a decode instance killed
mid-request ends that request with an error, not a hang."""
from __future__ import annotations

import json
import signal

import openai
import pytest

from tests.router.test_router_serve import RouterProcess
from tests.serve.conftest import ServerProcess
from tests.tiny_models import make_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    model = tmp_path_factory.mktemp("disagg-qwen3")
    make_model(model, "qwen3")
    store = tmp_path_factory.mktemp("kv-store")
    opts = json.dumps({"kv-store": {"directory": str(store), "fsync": False}})
    common = ("--served-model-name", "tiny", "--plugins", "kv-store", "--plugin-options", opts)
    colocated = ServerProcess(str(model), "--served-model-name", "tiny")
    prefill = ServerProcess(str(model), *common, "--role", "prefill")
    decode = ServerProcess(str(model), *common, "--role", "decode")
    router = RouterProcess("--prefill", prefill.base_url, "--decode", decode.base_url)
    yield colocated, prefill, decode, router
    router.stop()
    for s in (colocated, prefill, decode):
        s.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_disaggregated_text_equals_one_colocated_instance(pair):
    colocated, prefill, decode, router = pair
    ref, via = _client(colocated.base_url), _client(router.base_url)
    for i in range(3):
        prompt = f"The quick brown fox {i} jumps over the lazy dog. " * 5
        want = ref.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0).choices[0].text
        got = via.completions.create(model="tiny", prompt=prompt + "", max_tokens=16, temperature=0)
        assert got.choices[0].text == want
        messages = [{"role": "user", "content": f"Paged attention {i} keeps the KV cache in blocks. " * 4}]
        want = ref.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                           temperature=0).choices[0].message.content
        stream = via.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                             stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
    m = decode.metrics()
    # the decode instance took the prompts' blocks from the store and computed only what follows them
    assert m["deepinfer:kv_store_disk_hits_total"] > 0
    assert m["deepinfer:prefix_cache_hits_total"] >= 0.8 * m["deepinfer:prefix_cache_queries_total"]
    assert prefill.metrics()["deepinfer:generation_tokens_total"] == 6  # one token a request


def test_a_killed_decode_instance_fails_its_request(pair):
    _, _, decode, router = pair
    via = _client(router.base_url)
    stream = via.completions.create(model="tiny", prompt="import os\n" * 20, max_tokens=800, temperature=0,
                                    stream=True, extra_body={"ignore_eos": True})
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for n, _ in enumerate(stream):
            if n == 2:
                decode.stop(signal.SIGKILL)
