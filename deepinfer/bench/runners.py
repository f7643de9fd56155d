"""Timed runs of one workload on deepinfer and on the transformers peer."""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field

from deepinfer.bench.workloads import Workload


@dataclass(slots=True)
class RunResult:
    name: str
    seconds: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.median_s

    @property
    def total_tok_s(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.median_s


def run_deepinfer(llm, wl: Workload, repeats: int, warmup: bool = True) -> RunResult:
    from deepinfer.core.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.output_lens]
    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    if warmup:
        # enough requests that one step prefills while others decode, so that every kernel variant
        # (and the allocator's blocks) is ready before the clock starts; short outputs
        budget, n = llm.engine.config.max_num_batched_tokens, 2
        while n < len(prompts) and sum(len(p) for p in wl.prompts[:n]) <= budget:
            n += 1
        warm = [SamplingParams(temperature=0, max_tokens=min(8, p.max_tokens), ignore_eos=True) for p in params[:n]]
        llm.generate(prompts[:n], warm, use_tqdm=False)
    res = RunResult("deepinfer", prompt_tokens=wl.num_prompt_tokens)
    for _ in range(repeats):
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        res.seconds.append(time.perf_counter() - t)
        res.output_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        ttft = [o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outs]
        res.extra["ttft_ms_median"] = 1000 * statistics.median(ttft)
    return res


def load_hf(model_dir: str, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    kw = {"dtype": getattr(torch, dtype)} if dtype != "auto" else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, **kw).to(device).eval()


def run_hf_generate(model, wl: Workload, repeats: int) -> RunResult:
    """transformers generate() on the whole batch at once (prompts of equal length, no padding)."""
    import torch

    lens = {len(p) for p in wl.prompts}
    outs = set(wl.output_lens)
    if len(lens) != 1 or len(outs) != 1:
        raise ValueError("the generate() peer needs equal prompt and output lengths; use the throughput peer")
    n = outs.pop()
    ids = torch.tensor(wl.prompts, device=model.device)
    kw = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "eos_token_id": None, "pad_token_id": 0,
              "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 2, "min_new_tokens": 2,
                                      "attention_mask": torch.ones_like(ids[:, :8])})  # warm-up
        res = RunResult("transformers generate()", prompt_tokens=wl.num_prompt_tokens)
        for _ in range(repeats):
            _sync(model)
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            _sync(model)
            res.seconds.append(time.perf_counter() - t)
            res.output_tokens = int(out.shape[0] * (out.shape[1] - ids.shape[1]))
    return res


def run_hf_generate_batch(model, wl: Workload, repeats: int) -> RunResult:
    """transformers' continuous batching (generate_batch); every request runs to the longest output
    length, since it takes one max_new_tokens: its rate counts every token it generates."""
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=max(wl.output_lens), do_sample=False, eos_token_id=-1, pad_token_id=0)
    kw = {"generation_config": gc, **_cache_for(wl, gc.max_new_tokens)}
    res = RunResult("transformers generate_batch()", prompt_tokens=wl.num_prompt_tokens)
    model.generate_batch(inputs=wl.prompts[:2], **kw)  # warm-up
    for _ in range(repeats):
        _sync(model)
        t = time.perf_counter()
        out = model.generate_batch(inputs=wl.prompts, **kw)
        _sync(model)
        res.seconds.append(time.perf_counter() - t)
        res.output_tokens = sum(len(o.generated_tokens) for o in out.values())
    return res


def _cache_for(wl: Workload, max_new_tokens: int) -> dict:
    """A KV cache of the pages the workload needs, all requests at once. Left to itself,
    generate_batch sizes its cache from the memory it finds: on a CPU without psutil that is the
    whole NUMA node's, not the process's limit, and a 24 GiB machine killed the run (SIGKILL).
    (transformers before ContinuousBatchingConfig: its own sizing.)"""
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        return {}
    page = 256
    pages = sum(-(-(len(p) + max_new_tokens) // page) for p in wl.prompts)
    return {"continuous_batching_config": ContinuousBatchingConfig(
        page_size=page, num_blocks=pages + 1, max_batch_tokens=min(8192, max(wl.num_prompt_tokens, page)))}


def _sync(model) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()


def gpu_idle(llm, wl: Workload) -> dict[str, float]:
    """One more run with device events around every step: the share of the decode phase's wall
    time (first decode-only step to the last step) when the device ran none of the steps."""
    from deepinfer.core.sampling_params import SamplingParams

    runner = llm.engine.runner
    if runner.device.type == "cpu":
        raise ValueError("--gpu-idle times steps with device events, which the CPU has none of; "
                         "run it on a GPU (or NPU) device")
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.output_lens]
    runner.timeline = []
    try:
        llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params, use_tqdm=False)
        llm.engine.ctx.device.synchronize()
        steps = runner.timeline
    finally:
        runner.timeline = None
    first = next((i for i, (_, _, decode) in enumerate(steps) if decode), None)
    if first is None:
        raise ValueError("the workload ran no decode-only step, so there is no decode phase to measure")
    phase = steps[first:]
    span = phase[0][0].elapsed_time(phase[-1][1])
    gaps = sum(max(0.0, a[1].elapsed_time(b[0])) for a, b in itertools.pairwise(phase))
    return {"gpu_idle_fraction": gaps / span, "decode_phase_ms": span, "decode_steps": len(phase)}
