"""The draft model's compiled step (CPU) against its eager step: same tokens, same probabilities,
same logits and the same KV written, for every length and for one or two new tokens (calls in the
guard-skipping stance need no compilation and agree with fully guarded calls); sampled drafts
through it; pools exact."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM
from deepinfer.core import compiled_step
from deepinfer.core.eager_batch import build_step_batch
from deepinfer.plugins import AttentionLayerSpec
from deepinfer_builtin.attention.torch_attn import TorchAttention


@pytest.mark.slow
@pytest.mark.parametrize(("draft", "dtype"), [("demo", "float32"), ("demo", "bfloat16"), ("sliding", "float32")])
def test_compiled_draft_step_matches_the_eager_step(draft, dtype, tmp_path):
    """In bfloat16 the compiled step keeps float32 between fused ops where the eager one rounds to
    bfloat16, so its probabilities and KV agree to bfloat16's precision, and its token is the
    eager one's or a near-tie of it. "sliding": a tiny Qwen3 whose first layer has a window of 6
    keys, stepped well past it (its decodes then read only the window's keys)."""
    if draft == "demo":
        llm = LLM(progress=False, plugins=["draft-model"], plugin_options={"draft-model": {"dtype": dtype}})
    else:
        from tests.tiny_models import hybrid, make_model

        make_model(tmp_path, "qwen3", **hybrid(6))
        llm = LLM(str(tmp_path), dtype=dtype, progress=False, plugins=["draft-model"],
                  plugin_options={"draft-model": {"model": str(tmp_path)}})
    runner = llm.engine.drafter.runner.draft  # (the SecondModel)
    assert runner.dtype == getattr(torch, dtype)
    assert (draft == "sliding") == any(s.sliding_window for s in runner.model.attention_layers())
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == "float32" else {"rtol": 2 ** -5, "atol": 2e-2}
    logits_tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == "float32" else {"rtol": 2 ** -5, "atol": 0.1}
    step = runner.compiled
    assert step is not None and step.failed is None and step.warm, step and step.failed
    assert compiled_step._default_stance()  # (so the calls below take the guard-skipping stance)
    prompt = llm.get_tokenizer().encode("def read_config(path):\n    with open(path) as f:\n")
    n = len(prompt) + 18
    blocks = runner.pool.allocate(2 * -(-n // runner.block_size))
    table = [b.block_id for b in reversed(blocks)][::2]  # scattered and out of order
    bs = runner.block_size
    with torch.inference_mode():
        runner.last_logits([(prompt, 0, table)])  # the prompt's KV, eagerly
        tokens, pos, i = [prompt[-1]], len(prompt), 0
        while pos + len(tokens) <= n:  # one and two new tokens in turn, at every length
            feed = [(tokens, pos, table)]
            assert step.covers(feed)
            with torch._dynamo.config.patch(error_on_recompile=True):  # (run sets failed if it would)
                skipping = step.run(feed)  # the guards' skipping stance
            assert skipping is not None, step.failed
            prob, best, logits = skipping
            # every guard checked and no compilation allowed: the same compiled step, the same
            # result (what makes skipping the other guards sound)
            step.warm = False
            with torch.compiler.set_stance("fail_on_recompile"):
                checked = step.run(feed)
            step.warm = True
            assert step.failed is None and checked is not None, step.failed
            assert torch.equal(checked[0], prob) and torch.equal(checked[1], best) and torch.equal(checked[2], logits)
            slots = [table[p // bs] * bs + p % bs for p in range(pos, pos + len(tokens))]
            compiled_kv = [c[:, slots].clone() for c in runner.kv_caches]
            eager_logits = runner.last_logits(feed)  # rewrites the slots
            eager_probs = eager_logits.softmax(-1)
            eager_p, eager_best = eager_probs.max(-1)
            assert logits.dtype == torch.float32 and logits.shape == eager_logits.shape
            torch.testing.assert_close(logits, eager_logits, **logits_tol)
            assert best.tolist() == eager_best.tolist() or (
                dtype == "bfloat16" and eager_p - eager_probs[0, best] < tol["atol"])
            torch.testing.assert_close(prob, eager_p, **tol)
            for got, want in zip(compiled_kv, (c[:, slots] for c in runner.kv_caches), strict=True):
                if dtype == "float32":
                    torch.testing.assert_close(got, want, **tol)
                else:  # a few bfloat16 roundings apart over the whole slots' KV
                    assert (got.float() - want.float()).norm() <= 2 ** -5 * want.float().norm()
            pos, i = pos + len(tokens), i + 1
            tokens = [int(best)] if i % 2 == 0 else [int(best), prompt[i % len(prompt)]]
    runner.pool.free(reversed(blocks))
    runner.pool.check_all_free()
    # several sequences, three new tokens or more, or a single cached key: eager steps
    assert not step.covers([([1], 5, table), ([2], 5, table)])
    assert not step.covers([([1, 2, 3], 5, table)])
    assert not step.covers([([1], 0, table)])


def test_draft_compile_option():
    """Off by the option; on by default on the CPU (above)."""
    llm = LLM(progress=False, plugins=["deepspark"], plugin_options={"deepspark": {"compile": False}})
    assert llm.engine.drafter.runner.draft.compiled is None


@pytest.mark.slow
def test_a_step_that_fails_to_compile_runs_eagerly(caplog):
    """A compiled step that raises (as without a C++ compiler) leaves the draft eager, says why, and
    changes no output."""
    from deepinfer import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = "class Stack:\n    def __init__(self):\n"
    want = LLM(progress=False).generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(progress=False, plugins=["draft-model"])
    step = llm.engine.drafter.runner.draft.compiled

    def no_compiler(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    step._step = no_compiler
    with caplog.at_level("WARNING", logger="deepinfer"):
        got = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
    assert step.failed == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    assert "run eagerly" in caplog.text and not step.covers([([1], 5, [0])])
    assert llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"] > 0
    llm.engine.drafter.runner.draft.pool.check_all_free()


@pytest.mark.parametrize("windows", [(None, None), (None, 5)])
def test_sequence_metadata_matches_build_metadata(windows):
    """The compiled step's inputs, built without a StepBatch, equal ``build_metadata``'s for the
    same step: one sequence, 1-3 new tokens after 1-40 cached ones, with and without a sliding
    window (whose decodes read only their window's keys)."""
    attn = TorchAttention(TorchAttention.Options(), None)
    layers = [AttentionLayerSpec(i, 4, 2, 8, sliding_window=w) for i, w in enumerate(windows)]
    attn.allocate_kv_cache(layers, 16, 4, torch.float32, torch.device("cpu"))
    table = [9, 3, 14, 0, 7, 2, 11, 5, 12, 1, 6, 15]
    for cached in range(1, 41):
        for q in (1, 2, 3):
            want = attn.build_metadata(build_step_batch([([1] * q, cached, table)], 4, torch.device("cpu")))
            n = cached + q
            got = attn.sequence_metadata(torch.tensor([table[p // 4] * 4 + p % 4 for p in range(n)]), q)
            assert len(got.writes) == len(want.writes) == 1
            assert got.writes[0][1] is want.writes[0][1] is None
            assert got.q_index is want.q_index is None and got.out_index is want.out_index is None
            assert got.one_seq == want.one_seq == (q > 1)
            assert got.kv_slots.keys() == want.kv_slots.keys() == {(0, w) for w in windows}
            exact = {"rtol": 0, "atol": 0}  # (and the same dtype and device)
            torch.testing.assert_close(got.writes[0][0], want.writes[0][0], **exact)
            for key, slots in want.kv_slots.items():
                torch.testing.assert_close(got.kv_slots[key], slots, **exact, msg=f"{cached} {q} {key}")
                # the compiled step is guarded on strides: a row's is its own length at every length
                assert got.kv_slots[key].stride() == (got.kv_slots[key].shape[1], 1)
            assert got.masks.keys() == want.masks.keys()
            for w, mask in want.masks.items():
                assert (got.masks[w] is None) == (mask is None), (cached, q, w)
                if mask is not None:
                    torch.testing.assert_close(got.masks[w], mask, **exact, msg=f"{cached} {q} {w}")
    attn.allocate_kv_cache([AttentionLayerSpec(0, 4, 2, 8, kv_group=1)], 16, 4, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="one KV group"):
        attn.sequence_metadata(torch.arange(5), 1)


@pytest.mark.slow
def test_sampled_drafts_come_from_the_compiled_step_and_change_nothing():
    """A sampled request's draft steps of one sequence run compiled too (the step's logits, then the
    request's filtering and draw): in float32 the same tokens as the eager draft gives, drafts
    accepted, pools whole."""
    from deepinfer import SamplingParams

    params = [SamplingParams(temperature=0.8, top_k=50, seed=s, max_tokens=32, ignore_eos=True) for s in (3, 4)]
    prompts = ["def read_config(path):\n", "class Stack:\n"]
    opts = {"draft-model": {"dtype": "float32"}}
    eager = LLM(progress=False, dtype="float32", plugins=["draft-model"],
                plugin_options={"draft-model": {**opts["draft-model"], "compile": False}})
    want = [[o.outputs[0].token_ids for o in eager.generate([p], s, use_tqdm=False)] for p, s in zip(prompts, params)]
    llm = LLM(progress=False, dtype="float32", plugins=["draft-model"], plugin_options=opts)
    step = llm.engine.drafter.runner.draft.compiled
    calls = []
    run = step.run
    step.run = lambda feeds: calls.append(feeds) or run(feeds)
    got = [[o.outputs[0].token_ids for o in llm.generate([p], s, use_tqdm=False)] for p, s in zip(prompts, params)]
    assert got == want
    assert len(calls) > 32 and step.failed is None  # (a sampled round drafts up to 5 a step)
    assert llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"] > 0
    llm.engine.drafter.runner.draft.pool.check_all_free()
    llm.engine.kv.pool.check_all_free()
