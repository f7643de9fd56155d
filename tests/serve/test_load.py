"""200 concurrent streaming requests on the embedded demo model, then an entirely free KV pool."""
from __future__ import annotations

import asyncio

import openai
import pytest

from tests.serve.conftest import ServerProcess

NUM_STREAMS = 200
MAX_TOKENS = 16
PROMPTS = ["import os\n", "def read_config(path):\n", "The quick brown fox", "print('hello world')\n"]


@pytest.fixture(scope="module")
def demo_server():
    srv = ServerProcess(None, "--served-model-name", "demo", ready_timeout=300)  # no model: the demo model
    yield srv
    assert srv.stop() == 0


async def _one_stream(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, object]:
    stream = await client.completions.create(
        model="demo", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish, usage


async def _all_streams(base_url: str) -> list:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                                  timeout=600) as client:
        return await asyncio.gather(*(_one_stream(client, i) for i in range(NUM_STREAMS)))


def test_200_concurrent_streams_complete_with_exact_counts_and_free_the_pool(demo_server):
    before = demo_server.wait_idle()
    results = asyncio.run(_all_streams(demo_server.base_url))
    after = demo_server.wait_idle()
    assert len(results) == NUM_STREAMS
    for _, finish, usage in results:
        assert finish == "length"
        assert usage.completion_tokens == MAX_TOKENS
        assert usage.total_tokens == usage.prompt_tokens + MAX_TOKENS
    generated = after["deepinfer:generation_tokens_total"] - before["deepinfer:generation_tokens_total"]
    assert generated == NUM_STREAMS * MAX_TOKENS
    prompt = after["deepinfer:prompt_tokens_total"] - before["deepinfer:prompt_tokens_total"]
    assert prompt == sum(u.prompt_tokens for _, _, u in results)
    assert after["deepinfer:request_success_total"] - before["deepinfer:request_success_total"] == NUM_STREAMS
    assert after["deepinfer:kv_cache_usage"] == 0.0
    assert after["deepinfer:kv_cache_free_blocks"] == after["deepinfer:kv_cache_total_blocks"]
    assert after["deepinfer:time_to_first_token_seconds_count"] - before.get(
        "deepinfer:time_to_first_token_seconds_count", 0) == NUM_STREAMS
