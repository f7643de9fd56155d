"""Steps of one sequence computing many tokens (a prompt, the rest of one after a cached prefix)
replayed from prefill graphs give the eager engine's tokens and prompt logprobs; steps the graphs
cannot take (two prompts at once, a prompt longer than the largest token count) run eagerly.

On the CPU the graphs are stood in for by ``EagerGraphs`` (tests/plugins/test_graphs.py), with the
Triton backend in the interpreter with its kernels' torch references (tests/reference_kernels.py),
in a subprocess; on a GPU the real CUDA graphs run, with the real kernels, set up by the engine's
own defaults.
"""
from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.interpreter import run_interpreted

ROOT = Path(__file__).resolve().parents[2]
# prompt lengths: 5 (pads to 8), 13 (16), 32 (32), 41 (more than the largest, 32: eager); then a
# prompt sharing the 32-token one's first 24 tokens (a cached prefix: 9 to compute, from 24)
LENGTHS = [5, 13, 32, 41]


def _prompts() -> list[list[int]]:
    prompts = [[6 + (i * 11 + j * 7) % 300 for j in range(n)] for i, n in enumerate(LENGTHS)]
    return [*prompts, prompts[2][:24] + [9, 8, 7, 6, 5, 4, 3, 2, 1]]


#: two new prompts of one step (two sequences: eager)
PAIR = [[200 + j for j in range(7)], [100 + 3 * j for j in range(11)]]


@contextlib.contextmanager
def counted_replays(sleep: bool = False):
    """Counts the replays of graphs of several rows a sequence, by rows (a Counter, cleared by the
    caller between runs); ``sleep``: the device sleeps a few milliseconds before each (a GPU)."""
    from deepinfer.core.graphs import DecodeGraphs

    replayed: Counter[int] = Counter()
    run_padded = DecodeGraphs.run_padded

    def counting(self, size, *args, **kwargs):
        replayed[self.query_len] += 1
        if sleep:
            torch.cuda._sleep(5_000_000)  # (cycles)
        return run_padded(self, size, *args, **kwargs)

    DecodeGraphs.run_padded = counting
    try:
        yield replayed
    finally:
        DecodeGraphs.run_padded = run_padded


def prefill_both(model_dir: str, graphs_factory, sizes: list[int] | None, **engine) -> dict:
    """Greedy tokens and their logprobs (and the prompts', but for the cached prefix's), every
    step eager and with prefill (and decode) graphs: the prompts one request at a time (each
    prompt a step of its own), then two at once. Also the token counts the prefill steps
    replayed and the cached tokens of the last single request.
    ``sizes`` None: the engine's own graphs (a GPU); else graphs_factory's, enabled here."""
    from deepinfer import LLM, SamplingParams

    def params(n: int, prompt_logprobs: int | None = 1):  # (prompt logprobs turn prefix-cache hits off)
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=3,
                              prompt_logprobs=prompt_logprobs)

    prompts = _prompts()
    out: dict = {}
    with counted_replays() as replayed:
        for name in ("eager", "graphs"):
            replayed.clear()
            eager = name == "eager" or sizes is not None
            llm = LLM(model_dir, plugins=["triton", "prefix-cache"], progress=False, enforce_eager=eager, **engine)
            if name == "graphs" and sizes is not None:
                graphs = graphs_factory()
                llm.engine.runner.enable_prefill_graphs(graphs, sizes, 64)
                llm.engine.runner.enable_graphs(graphs, [1, 2], 64)
            res = [llm.generate([{"prompt_token_ids": p}], [params(6, None if i == len(LENGTHS) else 1)],
                                use_tqdm=False)[0] for i, p in enumerate(prompts)]
            res += llm.generate([{"prompt_token_ids": p} for p in PAIR], [params(4), params(5)], use_tqdm=False)
            out[name] = {
                "tokens": [o.outputs[0].token_ids for o in res],
                # the prompt's, then the sampled tokens' (the first from the prefill's last row)
                "logprobs": [[None if lp is None else {str(t): v for t, v in lp.items()}
                              for lp in (o.prompt_logprobs or []) + o.outputs[0].logprobs] for o in res],
                "cached": res[len(prompts) - 1].num_cached_tokens,
                "replayed": {str(k): v for k, v in replayed.items()},
                "sets": sorted(llm.engine.runner.prefill_graphs.sets) if llm.engine.runner.prefill_graphs else []}
            llm.engine.kv.pool.check_all_free()
            del llm
    return out


def chunked_both(model_dir: str, graphs_factory, sleep: bool = False, **engine) -> dict:
    """One 41-token prompt in chunks of 8 (steps of 8 tokens, one after another, that sample
    nothing until the last): greedy tokens and logprobs every step eager and with prefill graphs
    of 8 tokens, and the replays. ``graphs_factory`` None: the engine's own graphs (a GPU), whose
    device then sleeps before each replay, so that it stays behind the host (``sleep``)."""
    from deepinfer import LLM, SamplingParams

    prompt = [{"prompt_token_ids": [6 + (j * 13) % 300 for j in range(41)]}]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3)
    out = {}
    with counted_replays(sleep) as replayed:
        for name in ("eager", "graphs"):
            replayed.clear()
            own = name == "graphs" and graphs_factory is None
            llm = LLM(model_dir, plugins=["triton"], progress=False, enforce_eager=not own, max_num_batched_tokens=8,
                      cuda_graph_prefill_sizes=[8], **engine)
            if name == "graphs" and graphs_factory is not None:
                graphs = graphs_factory()
                llm.engine.runner.enable_prefill_graphs(graphs, [8], 64)
                llm.engine.runner.enable_graphs(graphs, [1], 64)
            o = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            out[name] = {"tokens": o.token_ids, "logprobs": [{str(t): v for t, v in lp.items()} for lp in o.logprobs],
                         "replayed": {str(k): v for k, v in replayed.items()}}
            llm.engine.kv.pool.check_all_free()
            del llm
    return out


def check_chunked(got: dict, tol: float) -> None:
    eager, graphs = got["eager"], got["graphs"]
    assert graphs["tokens"] == eager["tokens"] and eager["replayed"] == {}
    for a, b in zip(eager["logprobs"], graphs["logprobs"], strict=True):
        assert a.keys() == b.keys() and max(abs(a[t] - b[t]) for t in a) <= tol
    assert graphs["replayed"] == {"8": 5}  # five chunks of 8 (the 41st token is a one-token step)


def check(got: dict, sizes: list[int], tol: float) -> None:
    """Graphs give the eager tokens, logprobs within ``tol``, and replayed where they fit."""
    eager, graphs = got["eager"], got["graphs"]
    assert graphs["tokens"] == eager["tokens"]
    assert graphs["sets"] == sizes and eager["sets"] == [] and eager["replayed"] == {}
    for a_req, b_req in zip(eager["logprobs"], graphs["logprobs"], strict=True):
        assert len(a_req) == len(b_req)
        for a, b in zip(a_req, b_req, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.keys() == b.keys()
                assert max(abs(a[t] - b[t]) for t in a) <= tol
    assert graphs["cached"] == eager["cached"] == 24  # the last single prompt's prefix came from the cache
    # one replay a single prompt that fits: 5 -> 8, 13 -> 16, 32 -> 32, the 9 tokens after the
    # cached prefix -> 16; 41 tokens and the two prompts of one step ran eagerly
    assert graphs["replayed"] == {"8": 1, "16": 2, "32": 1}


@pytest.mark.slow
def test_prefill_steps_from_graphs_give_the_eager_tokens_in_the_interpreter(tmp_path):
    from tests.tiny_models import hybrid, make_model

    make_model(tmp_path, "qwen3", **hybrid(12))
    res = run_interpreted(["-m", "tests.plugins.test_prefill_graphs", str(tmp_path)], reference_attention=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    check(got["single"], [8, 16, 32], 1e-4)
    check_chunked(got["chunked"], 1e-4)


def test_prefill_graph_sizes_are_checked():
    from pydantic import ValidationError

    from deepinfer.core.config import EngineConfig
    from deepinfer.core.graphs import default_prefill_sizes, usable_prefill_sizes

    assert EngineConfig(cuda_graph_prefill_sizes="none").cuda_graph_prefill_sizes == []
    assert EngineConfig(cuda_graph_prefill_sizes="[]").cuda_graph_prefill_sizes == []  # (the environment's form)
    assert EngineConfig(cuda_graph_prefill_sizes="16,64").cuda_graph_prefill_sizes == [16, 64]
    with pytest.raises(ValidationError, match="at least 2"):
        EngineConfig(cuda_graph_prefill_sizes=[1, 8])
    assert default_prefill_sizes(8192) == [16, 32, 64, 128, 256, 384, 512, 768, 1024]
    # a budget between two counts keeps the one above it (a full chunk pads to it)
    assert default_prefill_sizes(300) == [16, 32, 64, 128, 256, 384]
    assert usable_prefill_sizes([64, 8, 16, 8], 16) == [8, 16] and usable_prefill_sizes([8], 4) == [8]


@pytest.mark.gpu
def test_cuda_prefill_graphs_give_the_eager_tokens(tmp_path):
    from tests.tiny_models import hybrid, make_model

    make_model(tmp_path, "qwen3", **hybrid(12))
    # the engine's own capture (the builder's path), with the interpreter test's token counts
    got = prefill_both(str(tmp_path), None, None, device="sm90", dtype="float32", block_size=4,
                       num_kv_blocks=96, max_model_len=96, cuda_graph_prefill_sizes=[8, 16, 32])
    check(got, [8, 16, 32], 1e-4)


@pytest.mark.gpu
def test_cuda_prefill_graphs_of_chunks_behind_the_host_give_the_eager_tokens(tmp_path):
    """Chunks that sample nothing replay the same graphs one after another while the device lags
    behind the host: each step is finished before the host fills the one two after it."""
    from tests.tiny_models import make_model

    make_model(tmp_path, "llama")
    check_chunked(chunked_both(str(tmp_path), None, sleep=True, device="sm90", dtype="float32", block_size=4,
                               num_kv_blocks=96, max_model_len=96), 1e-4)


if __name__ == "__main__":
    from tests.plugins.test_graphs import EagerGraphs

    cpu = {"device": "cpu", "dtype": "float32", "block_size": 4, "num_kv_blocks": 96, "max_model_len": 96,
           "plugin_options": {"triton": {"split_size": 16}}}
    print(json.dumps({"single": prefill_both(sys.argv[1], EagerGraphs, [8, 16, 32], **cpu),
                      "chunked": chunked_both(sys.argv[1], EagerGraphs, **cpu)}))
