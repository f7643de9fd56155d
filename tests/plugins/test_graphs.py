"""Decode steps replayed from device graphs give the eager engine's tokens: padded batches, the
overlap path's placeholders resolved into the static inputs, and eager fallback for long sequences.

On the CPU the graphs are stood in for by ``EagerGraphs``, which re-runs the captured function on
the same static tensors at every replay (so a step that fills them wrongly fails), with the Triton
backend in the interpreter (in a subprocess: TRITON_INTERPRET must be set before triton is
imported): its real kernels with the device's fused kernels, its torch references without them
(tests/reference_kernels.py). On a GPU the real CUDA graphs run.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from deepinfer.plugins.capabilities import DeviceGraphs
from tests.interpreter import run_interpreted

ROOT = Path(__file__).resolve().parents[2]


class EagerGraphs(DeviceGraphs):
    """A stand-in for CUDA graphs: replay re-runs the function and refills the captured output."""

    def __init__(self) -> None:
        self.captured = 0

    def capture(self, fn):
        self.captured += 1
        out = fn().clone()
        return (lambda: out.copy_(fn())), out


def _prompts(lengths: list[int]) -> list[list[int]]:
    return [[6 + (i * 11 + j * 7) % 300 for j in range(n)] for i, n in enumerate(lengths)]


def run_both(model_dir: str, prompts, max_tokens: list[int], graphs_factory, sizes, max_seq_len: int,
             overlap: bool | None = None, fused: bool = False, sampled: int | None = None, **engine) -> dict:
    """Greedy tokens with graphs off and on, the captured sizes the graph steps replayed and how
    many replays took their argmaxes from the head graphs ("heads") (``overlap``: force the
    engine's overlapped path on or off; None: its own choice; ``fused``: give the model the CUDA
    devices' fused kernels, with which small replays stage their inputs; ``sampled``: this
    request samples, seeded, at temperature 1)."""
    from deepinfer import LLM, SamplingParams
    from deepinfer.core.graphs import DecodeGraphs

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    if sampled is not None:
        params[sampled] = SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens[sampled], ignore_eos=True)
    replayed: Counter[int] = Counter()
    run, head = DecodeGraphs.run, DecodeGraphs.replay_head

    def counting(self, size, *args, **kwargs):
        replayed[size] += 1
        return run(self, size, *args, **kwargs)

    def heads(self, size):
        replayed["heads"] += 1
        return head(self, size)

    out = {}
    DecodeGraphs.run, DecodeGraphs.replay_head = counting, heads
    try:
        for name in ("eager", "graphs"):
            llm = LLM(model_dir, plugins=["triton"], progress=False, enforce_eager=True, **engine)
            if fused:
                from deepinfer_kernels import FusedOps

                llm.engine.runner.model.use_fused_ops(FusedOps(single_token_gemv=False))
            if overlap is not None:
                llm.engine.overlap = overlap
            if name == "graphs":
                llm.engine.runner.enable_graphs(graphs_factory(), sizes, max_seq_len)
            res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            out[name] = [o.outputs[0].token_ids for o in res]
            llm.engine.kv.pool.check_all_free()
    finally:
        DecodeGraphs.run, DecodeGraphs.replay_head = run, head
    out["replayed"] = {str(k): v for k, v in replayed.items()}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_graph_steps_give_the_eager_tokens_in_the_interpreter(tmp_path, fused):
    from tests.tiny_models import hybrid, make_model

    make_model(tmp_path, "qwen3", **hybrid(12))
    res = run_interpreted(["-m", "tests.plugins.test_graphs", str(tmp_path)] + ["fused"] * fused,
                          reference_attention=not fused)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["graphs"] == got["eager"]
    # three sequences pad to the captured 4, then two replay 2; the longest outgrows max_seq_len
    # and the steps that hold it run eagerly
    assert got["replayed"].get("4", 0) > 0 and got["replayed"].get("2", 0) > 0
    replays = sum(v for k, v in got["replayed"].items() if k != "heads")
    assert replays < got["decode_steps"]
    # every size has a forward graph and a head graph, and every replay's samples (plain
    # greedy) came from its head graph, straight into the buffer the next replay reads
    assert got["captured"] == 6 and got["replayed"]["heads"] == replays
    assert got["in_place"].get("True", 0) > 0 and "False" not in got["in_place"]  # no copy of the samples
    # with the fused kernels the replays read their inputs from host memory in their first kernel
    assert (got["staged"] > 0) == fused and (got["uploads"] > 0) != fused
    # a request that samples at temperature 1 is in every step: no replay takes the head graphs'
    # argmaxes, and every request's tokens (the seeded one's too) are the eager engine's
    mixed = got["mixed"]
    assert mixed["graphs"] == mixed["eager"] and "heads" not in mixed["replayed"]
    assert sum(mixed["replayed"].values()) > 0
    assert [t for i, t in enumerate(mixed["graphs"]) if i != 1] == [t for i, t in enumerate(got["eager"]) if i != 1]


def test_graphs_need_an_attention_plugin_that_supports_them(tmp_path):
    from deepinfer import LLM
    from tests.tiny_models import make_model

    make_model(tmp_path, "llama", with_tokenizer=False)
    llm = LLM(str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="cannot run in device graphs"):
        llm.engine.runner.enable_graphs(EagerGraphs(), [1, 2], 64)


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [True, False])
def test_cuda_graphs_give_the_eager_tokens(tmp_path, overlap):
    from deepinfer_builtin.devices.cuda import CUDAGraphs
    from tests.tiny_models import hybrid, make_model

    make_model(tmp_path, "qwen3", **hybrid(24))
    prompts = _prompts([5, 40, 130, 17, 260, 3, 77])
    # the 260-token prompt outgrows the captured 256 and ends early; the rest then replay graphs
    got = run_both(str(tmp_path), prompts, [40, 9, 33, 1, 12, 25, 20], lambda: CUDAGraphs(torch.device("cuda")), [1, 2, 4, 8], 256,
                   device="sm90", dtype="float32", kv_cache_memory_gb=0.5, max_model_len=512,
                   plugin_options={"fcfs": {"overlap": overlap}})
    assert got["graphs"] == got["eager"]
    assert sum(got["replayed"].values()) > 0


def _main(model_dir: str, fused: bool) -> None:
    factory = EagerGraphs()
    # decodes: 3 sequences (until the first ends), then 2, then the long one alone past 36 tokens
    max_tokens = [4, 14, 9]
    # overlapped: placeholders of the step in flight are resolved into the graphs' static inputs;
    # the greedy samples were written straight into the graphs' buffer of placeholder values
    from deepinfer.core.graphs import DecodeGraphs

    upload = DecodeGraphs._upload_and_replay
    in_place: Counter[bool] = Counter()

    def watching(self, size, prev_tokens=None):
        if prev_tokens is not None:
            in_place[prev_tokens.data_ptr() == self.prev_tokens.data_ptr()] += 1
        return upload(self, size, prev_tokens)

    DecodeGraphs._upload_and_replay = watching
    from deepinfer.core.graphs import PackedInputs

    counts = Counter()
    staged, copy = PackedInputs.staged_replay, PackedInputs.upload
    PackedInputs.staged_replay = lambda self: (counts.update(["staged"]), staged(self))[1]
    PackedInputs.upload = lambda self, *a: (counts.update(["uploads"]), copy(self, *a))[1]
    got = run_both(model_dir, _prompts([3, 30, 9]), max_tokens, lambda: factory, [1, 2, 4], 36, overlap=True,
                   fused=fused, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64, max_model_len=64,
                   plugin_options={"triton": {"split_size": 16}})
    got["staged"], got["uploads"] = counts["staged"], counts["uploads"]
    got["in_place"] = {str(k): v for k, v in in_place.items()}
    got["captured"] = factory.captured
    # request 1, the longest, samples
    got["mixed"] = run_both(model_dir, _prompts([3, 30, 9]), max_tokens, EagerGraphs, [1, 2, 4], 36, overlap=True,
                            fused=fused, sampled=1, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64,
                            max_model_len=64, plugin_options={"triton": {"split_size": 16}})
    got["decode_steps"] = max(max_tokens) - 1
    print(json.dumps(got))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2:3] == ["fused"])
