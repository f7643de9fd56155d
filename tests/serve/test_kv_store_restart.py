"""deepinfer serve with kv-store's directory tier: multi-turn conversations keep at least 90% of their
prefix-cache hit rate across a server restart, and the text is the engine's without any cache."""
from __future__ import annotations

import json
import random

import openai
import pytest

from deepinfer import LLM, SamplingParams
from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "paged", "attention", "keeps", "blocks"]


def _hit_counts(server: ServerProcess) -> tuple[float, float]:
    m = server.metrics()
    return m["deepinfer:prefix_cache_hits_total"], m["deepinfer:prefix_cache_queries_total"]


def _turns(server: ServerProcess, texts: list[str], rng: random.Random, offline: LLM) -> tuple[list[str], float]:
    """One more turn of every conversation; the texts after it and the turn's hit rate."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    h0, q0 = _hit_counts(server)
    out = []
    for i, text in enumerate(texts):
        prompt = text + " " + " ".join(rng.choice(WORDS) for _ in range(12))
        extra = {"kv_retention": "agent"} if i == 0 else {}  # the first conversation an agent's
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                        extra_body=extra).choices[0].text
        want = offline.generate(prompt, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0].outputs[0].text
        assert got == want
        out.append(prompt + got)
    h1, q1 = _hit_counts(server)
    return out, (h1 - h0) / (q1 - q0)


def test_hit_rate_survives_a_restart(tiny_model, offline, tmp_path):
    opts = json.dumps({"kv-store": {"directory": str(tmp_path)}})
    flags = (str(tiny_model), "--served-model-name", "tiny", "--max-model-len", "256", "--plugins", "kv-store",
             "--plugin-options", opts)
    rng = random.Random(0)
    texts = [f"conversation {c}:" for c in range(4)]
    server = ServerProcess(*flags)
    texts, _ = _turns(server, texts, rng, offline)
    texts, before = _turns(server, texts, rng, offline)  # hits on what turn 1 left on the device
    assert server.stop() == 0
    server = ServerProcess(*flags)  # a new engine: an empty device pool
    texts, after = _turns(server, texts, rng, offline)
    m = server.metrics()
    server.stop()
    assert before > 0 and after >= 0.9 * before, (before, after)
    assert m["deepinfer:kv_store_disk_hits_total"] > 0 and m["deepinfer:kv_store_disk_corrupt_total"] == 0
    classes = {p.parent.parent.name for p in tmp_path.rglob("*.kvb")}
    assert classes == {"agent", "chat"}
