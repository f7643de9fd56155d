"""The two sides `deepinfer bench serve` compares: HTTP load against a server, and the offline engine."""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of the workload: exact prompt token ids and the number of tokens to generate."""

    prompt_ids: tuple[int, ...]
    output_len: int


@dataclass(slots=True)
class RequestResult:
    """What the client saw of one streamed request."""

    ok: bool
    start: float = 0.0
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def make_workload(num: int, input_len: int, output_len: int, vocab_size: int, seed: int) -> list[BenchRequest]:
    """Random prompts of exactly ``input_len`` tokens (the same for HTTP and offline)."""
    rng = random.Random(seed)
    low = min(16, vocab_size - 1)  # step over the ids tokenizers usually reserve for special tokens
    return [BenchRequest(tuple(rng.randrange(low, vocab_size) for _ in range(input_len)), output_len)
            for _ in range(num)]


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in ps}}
    s = sorted(values)
    out = {"mean": sum(s) / len(s)}
    for p in ps:
        out[f"p{p}"] = s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]  # nearest rank
    return out


# ------------------------------------------------------------------------------------------ HTTP
async def _one(client: Any, url: str, headers: dict[str, str], model: str, req: BenchRequest) -> RequestResult:
    body = {"model": model, "prompt": list(req.prompt_ids), "max_tokens": req.output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(ok=False, start=time.perf_counter())
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                if last is None:
                    res.ttft = now - res.start
                else:
                    res.itls.append(now - last)
                last = now
        res.e2e = time.perf_counter() - res.start
        res.ok = res.output_tokens == req.output_len
        if not res.ok:
            res.error = f"got {res.output_tokens} tokens, wanted {req.output_len}"
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash of the benchmark
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_http(base_url: str, model: str, api_key: str | None, workload: list[BenchRequest], concurrency: int,
                   request_rate: float, seed: int) -> tuple[list[RequestResult], float]:
    """Send the workload (Poisson arrivals at ``request_rate``, at most ``concurrency`` in flight)."""
    import httpx

    url = f"{base_url.rstrip('/')}/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        await _one(client, url, headers, model, BenchRequest(workload[0].prompt_ids, 2))  # warm-up

        async def limited(req: BenchRequest) -> RequestResult:
            async with sem:
                return await _one(client, url, headers, model, req)

        t0 = time.perf_counter()
        tasks = []
        for req in workload:
            tasks.append(asyncio.create_task(limited(req)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


async def http_ttft(base_url: str, model: str, api_key: str | None, workload: list[BenchRequest]) -> list[float]:
    """TTFT of each prompt sent alone (an idle server): the HTTP side of the TTFT comparison."""
    import httpx

    url = f"{base_url.rstrip('/')}/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        await _one(client, url, headers, model, BenchRequest(workload[0].prompt_ids, 1))
        out = []
        for req in workload:
            r = await _one(client, url, headers, model, BenchRequest(req.prompt_ids, 1))
            if r.ok:
                out.append(r.ttft)
        return out


# --------------------------------------------------------------------------------------- offline
def offline_ttft(engine: Any, workload: list[BenchRequest]) -> list[float]:
    """TTFT of each prompt added alone to an idle in-process engine."""
    from deepinfer.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    out = []
    for i, req in enumerate([workload[0], *workload]):
        rid = f"ttft-{i}"
        t0 = time.perf_counter()
        engine.add_request(rid, list(req.prompt_ids), params)
        first = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                if first is None and o.request_id == rid and o.outputs[0].token_ids:
                    first = time.perf_counter() - t0
        if i > 0 and first is not None:  # the first one warms up
            out.append(first)
    return out


def offline_throughput(llm: Any, workload: list[BenchRequest]) -> tuple[float, int]:
    """``LLM.generate`` on the whole workload: (seconds, output tokens)."""
    from deepinfer.core.sampling_params import SamplingParams

    prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in workload]
    params = [SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True) for r in workload]
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)
