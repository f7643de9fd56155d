"""``deepinfer serve --batch-invariant``: one request sent 1,000 times among random concurrent
requests always gets the same text and logprobs, and the log-likelihoods an evaluation harness
asks for (lm-eval's loglikelihood requests: echo, logprobs, the continuation's tokens summed) are
the same bits at 1 and at 4 concurrent requests."""
from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow  # 1,300 requests through a server

NEEDLE = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0, "logprobs": 2,
          "ignore_eos": True}


@pytest.fixture(scope="module")
def invariant_server(tiny_model):
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--max-model-len", "256", "--max-num-seqs",
                        "32", "--dtype", "float32", "--batch-invariant")
    yield srv
    srv.stop()


async def _posts(server, bodies: list[dict], concurrency: int) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
        async def one(body: dict) -> dict:
            async with gate:
                r = await client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def test_one_request_1000_times_under_random_concurrent_load_has_one_output(invariant_server):
    rng = random.Random(0)
    words = ["fox", "dog", "cat", "import", "def", "return", "class", "the", "a", "of", "to", "in", "for",
             "while", "yield", "async", "await"]
    fillers = [{"model": "tiny", "prompt": " ".join(rng.choices(words, k=rng.randrange(1, 40))),
                "max_tokens": rng.randrange(1, 16), "temperature": rng.choice([0, 0.7, 1.0]), "seed": i,
                "ignore_eos": True} for i in range(300)]
    bodies = [dict(NEEDLE) for _ in range(1000)] + fillers
    rng.shuffle(bodies)
    out = asyncio.run(_posts(invariant_server, bodies, 48))
    needles = {json.dumps([r["choices"][0]["text"], r["choices"][0]["logprobs"]]) for r, b in zip(out, bodies, strict=True)
               if b == NEEDLE}
    assert len(needles) == 1
    assert len(json.loads(needles.pop())[1]["token_logprobs"]) == 6


def test_harness_loglikelihoods_are_the_same_at_1_and_4_concurrent_requests(invariant_server):
    """lm-eval's loglikelihood request (its OpenAI-completions model): context and continuation
    as one prompt, echoed with logprobs, the continuation's token logprobs summed."""
    rng = random.Random(1)
    contexts = [[rng.randrange(3, 300) for _ in range(rng.randrange(4, 60))] for _ in range(30)]
    items = [(ids, rng.randrange(1, min(8, len(ids)))) for ids in contexts]  # (the last n tokens: the continuation)
    bodies = [{"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
              for ids, _ in items]

    def loglikelihoods(concurrency: int) -> list[float]:
        out = asyncio.run(_posts(invariant_server, bodies, concurrency))
        return [sum(r["choices"][0]["logprobs"]["token_logprobs"][len(ids) - n:len(ids)])
                for r, (ids, n) in zip(out, items, strict=True)]

    alone = loglikelihoods(1)
    assert all(x < 0 for x in alone)
    assert loglikelihoods(4) == alone
