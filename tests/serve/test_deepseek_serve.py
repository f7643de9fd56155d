"""`deepinfer serve MODEL_DIR` on a tiny random DeepSeek-V3 directory (latent KV layers, routed
experts): completions and chat, streamed and not, give the offline engine's greedy text."""
from __future__ import annotations

import pytest

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow  # a real server


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    from tests.tiny_models import make_model

    path = tmp_path_factory.mktemp("serve-deepseek-v3")
    make_model(path, "deepseek_v3", n_group=2, topk_group=1)
    return path


def test_a_deepseek_v3_directory_is_served_streamed_and_not(deepseek_dir):
    import openai

    from deepinfer import LLM, SamplingParams

    prompt = "The quick brown fox"
    want = LLM(str(deepseek_dir), device="cpu", progress=False, max_model_len=256).generate(
        prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    srv = ServerProcess(str(deepseek_dir), "--served-model-name", "ds", "--max-model-len", "256", "--device", "cpu")
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=60)
        args = {"model": "ds", "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(prompt=prompt, **args)
        streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **args))
        assert whole.choices[0].text == streamed == want
        assert whole.usage.completion_tokens == 12
        messages = [{"role": "user", "content": "Say hello"}]
        chat = client.chat.completions.create(messages=messages, **args).choices[0].message.content
        chunks = client.chat.completions.create(messages=messages, stream=True, **args)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat
        assert chat
    finally:
        assert srv.stop() == 0, srv.output()
