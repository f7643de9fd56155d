"""cache_salt keeps tenants' cached prefixes apart, on a server with the prefix-cache plugin."""
from __future__ import annotations

import openai
import pytest

from tests.serve.conftest import ServerProcess

# about 100 tokens: several 16-token blocks to cache
PROMPT = "def read_config(path):\n    with open(path) as f:\n        return f.read()\n" * 4


@pytest.fixture(scope="module")
def cached_server(tiny_model):
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--plugins", "prefix-cache",
                        "--max-model-len", "256")
    yield srv
    assert srv.stop() == 0


def _cached_tokens(client: openai.OpenAI, salt: str | None) -> tuple[int, str]:
    extra = {"cache_salt": salt} if salt else {}
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, extra_body=extra)
    return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].text


def test_cache_salt_separates_cached_prefixes_and_plugin_metrics_are_relayed(cached_server):
    client = openai.OpenAI(base_url=f"{cached_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    before = cached_server.metrics()
    first, text = _cached_tokens(client, None)
    again, text_again = _cached_tokens(client, None)
    assert first == 0 and again >= 16 and text_again == text
    assert _cached_tokens(client, "tenant-a") == (0, text)  # the unsalted prefix is not tenant a's
    assert _cached_tokens(client, "tenant-a") == (again, text)
    assert _cached_tokens(client, "tenant-b") == (0, text)
    after = cached_server.wait_idle()
    hits = after["deepinfer:prefix_cache_hits_total"] - before["deepinfer:prefix_cache_hits_total"]
    assert hits == 2 * again
    assert after["deepinfer:prefix_cache_cached_blocks"] > 0
    assert after["deepinfer:kv_cache_free_blocks"] == after["deepinfer:kv_cache_total_blocks"]


def test_streamed_usage_reports_the_cached_prompt_tokens_as_the_whole_reply_does(cached_server):
    client = openai.OpenAI(base_url=f"{cached_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "extra_body": {"cache_salt": "s"}}
    client.completions.create(**kw)  # warms the cache
    whole = client.completions.create(**kw).usage
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert whole.prompt_tokens_details.cached_tokens >= 16
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.prompt_tokens_details.cached_tokens


def test_echo_logprobs_of_a_cached_prompt_cover_every_prompt_token(cached_server):
    """Prompt logprobs need every position computed: the cache is passed over, not half-used."""
    client = openai.OpenAI(base_url=f"{cached_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    client.completions.create(**kw)  # warms the cache
    r = client.completions.create(**kw, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    n = r.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and all(v is not None for v in lp.token_logprobs[1:])
    assert len(lp.tokens) == n + r.usage.completion_tokens and r.choices[0].text.startswith(PROMPT)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
