"""Speculative decoding is lossless: same greedy tokens, target distribution preserved, pool exact."""
from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.core.request import Request
from deepinfer.core.verification import verify, verify_batch
from deepinfer_builtin.devices import cpu
from tests.tiny_models import hybrid, make_model

DRAFTERS = ["ngram", "draft-model", "deepspark"]
DEMO_PROMPTS = ["import os\n", "def read_config(path):\n", "class Stack:\n    def __init__(self):\n",
                "import sys\nimport re\n\n"]


def _assert_pools_free(llm: LLM) -> None:
    llm.engine.kv.pool.check_all_free()
    runner = getattr(llm.engine.drafter, "runner", None)
    if runner is not None:
        runner.draft.pool.check_all_free()
        assert not runner.seqs


@pytest.fixture(scope="module")
def demo_reference():
    base = LLM(progress=False, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    return [o.outputs[0].token_ids for o in base.generate(DEMO_PROMPTS, params, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_outputs_identical_on_the_demo_pair(drafter, demo_reference):
    # deepspark looks up at every batch size here (by default only at batch 1), so that its rounds
    # that mix lookups and the model's drafts are checked too
    options = {"deepspark": {"lookup_max_batch": 64}} if drafter == "deepspark" else {}
    llm = LLM(progress=False, dtype="float32", plugins=[drafter], plugin_options=options)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)]
    assert got == demo_reference
    m = llm.get_metrics()
    assert m["deepinfer:spec_decode_num_drafts"] > 0 and m["deepinfer:spec_decode_num_accepted_tokens"] > 0
    assert m["deepinfer:spec_decode_num_accepted_tokens"] <= m["deepinfer:spec_decode_num_verified_tokens"]
    assert m["deepinfer:spec_decode_num_verified_tokens"] <= m["deepinfer:spec_decode_num_draft_tokens"]
    if drafter == "deepspark":  # some of its rounds took the lookup's drafts (on by default)
        table = llm.engine.drafter.lookups.table
        assert sum(row[0] for row in table.trials) > table.buckets * llm.engine.drafter.options.prior_strength
    _assert_pools_free(llm)


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    draft = tmp_path_factory.mktemp("draft")
    make_model(target, "qwen3", **hybrid(12))
    make_model(draft, "llama", seed=1, num_hidden_layers=1)
    return str(target), str(draft)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_mixed_batch_with_preemption_is_lossless(drafter, random_pair):
    target, draft = random_pair
    prompts = [[7 + i, 8, 9, 10, 11] * (1 + i % 3) for i in range(8)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    penalised = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3)
    params = [greedy if i % 3 else penalised for i in range(8)]  # penalised requests do not speculate
    ref = [o.outputs[0].token_ids for o in LLM(target, dtype="float32", block_size=4, progress=False)
           .generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    opts = {} if drafter == "ngram" else {drafter: {"model": draft}}
    llm = LLM(target, dtype="float32", block_size=4, num_kv_blocks=24, max_model_len=64, plugins=[drafter],
              plugin_options=opts, progress=False)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]
    assert got == ref
    assert llm.get_metrics()["deepinfer:num_preemptions"] > 0
    _assert_pools_free(llm)


def test_drafts_left_on_the_device_are_verified_as_their_values(random_pair):
    """A proposal whose tokens are placeholders for a device tensor (``DeviceTokens``) verifies as
    the same proposal with the values would: ngram's drafts, handed over that way in an eager
    engine with preemption, give the reference's greedy tokens and the same acceptance; the values
    are read only after the verification step."""
    from deepinfer.core.interfaces import DeviceTokens
    from deepinfer.plugins import DraftProposal

    target, _ = random_pair
    prompts = [{"prompt_token_ids": [7 + i, 8, 9, 10, 11] * (2 + i % 3)} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    runs, fetched = {}, []
    for on_device in (False, True):
        llm = LLM(target, dtype="float32", block_size=4, num_kv_blocks=24, max_model_len=64, plugins=["ngram"],
                  progress=False)
        if on_device:
            drafter, propose = llm.engine.drafter, llm.engine.drafter.propose

            def handed_over(requests, propose=propose):
                plain = propose(requests)
                values = [t for p in plain.values() for t in p.tokens]
                source = DeviceTokens(torch.tensor(values), lambda v=values: fetched.append(len(v)) or v)
                out, row = {}, 0
                for rid, p in plain.items():
                    out[rid] = DraftProposal([-(row + j + 1) for j in range(len(p.tokens))], source=source)
                    row += len(p.tokens)
                return out

            drafter.propose = handed_over
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        m = llm.get_metrics()
        runs[on_device] = got, m["deepinfer:spec_decode_num_accepted_tokens"], m["deepinfer:num_preemptions"]
        _assert_pools_free(llm)
    ref = [o.outputs[0].token_ids for o in LLM(target, dtype="float32", block_size=4, progress=False)
           .generate(prompts, params, use_tqdm=False)]
    assert runs[True] == runs[False] and runs[True][0] == ref
    assert runs[True][1] > 0 and runs[True][2] > 0  # drafts accepted, requests preempted
    assert fetched  # the values were read (after each verification), not the placeholders verified


def test_seeded_sampling_with_a_drafter_is_reproducible_and_batch_independent(random_pair):
    target, draft = random_pair
    llm = LLM(target, dtype="float32", plugins=["draft-model"], plugin_options={"draft-model": {"model": draft}},
              progress=False)
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=16, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": [5, 6, 7]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    batch = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 9]}, {"prompt_token_ids": [4, 2]}],
                         [seeded, other, greedy], use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone
    # a greedy request verified beside sampled ones: its tokens and logprobs as without a drafter
    plain = LLM(target, dtype="float32", progress=False).generate({"prompt_token_ids": [4, 2]}, greedy,
                                                                   use_tqdm=False)[0].outputs[0]
    assert batch[2].outputs[0].token_ids == plain.token_ids
    for got, want in zip(batch[2].outputs[0].logprobs, plain.logprobs, strict=True):
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < 1e-4 for t in want)
    assert llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"] > 0
    _assert_pools_free(llm)


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_rejection_sampler_output_follows_the_target_distribution(deterministic_draft):
    """Chi-square test of the first emitted token against p, for fixed p and q on 6 tokens: 20,000
    requests of one draft each, verified in one batch (each draws its own numbers)."""
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    q = torch.tensor([0.40, 0.05, 0.20, 0.05, 0.10, 0.20])
    n = 20000
    logits = p.log().expand(2 * n, 6).contiguous()  # temperature 1: the target distribution is exactly p
    if deterministic_draft:
        drafts, qq = [0] * n, None  # always proposes token 0 (one-hot q)
    else:
        drafts = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(1)).tolist()
        qq = q[None]
    items = [(Request(f"r{i}", [1], SamplingParams(temperature=1.0)), [d], qq) for i, d in enumerate(drafts)]
    first = [tokens[0] for tokens in verify_batch(logits, items, torch.Generator().manual_seed(0))]
    counts = torch.bincount(torch.tensor(first), minlength=6).double()
    expected = p.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001


def test_greedy_verification_accepts_the_matching_prefix_then_corrects():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 7, 1]):
        logits[row, best] = 5.0
    req = Request("g", [1], SamplingParams(temperature=0))
    assert verify(logits, req, [3, 4, 2], None, torch.Generator()) == [3, 4, 7]
    assert verify(logits, req, [3, 4, 7], None, torch.Generator()) == [3, 4, 7, 1]  # bonus token


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_deepspark_mixing_plain_and_speculative_rounds_is_lossless(demo_reference, overlap):
    """Skipping in eager steps too, with explore_every 2, deepspark alternates plain steps and
    speculative rounds whatever the timings: the greedy output stays the target's, every pool is
    free after. With ``overlap_plain_rounds`` (and the engine's overlapped path switched on, as an
    asynchronous device would have it), plain rounds are left running while the next is planned,
    and a speculative round first takes them."""
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"],
              plugin_options={"deepspark": {"explore_every": 2, "skip_when_slower": "always", "skip_min_batch": 1,
                                            "overlap_plain_rounds": overlap, "skip_margin": 0.3}})
    assert llm.engine.overlap is False and llm.engine.drafter.skips_rounds is overlap  # (a synchronous CPU)
    assert llm.engine.drafter.rates.margin == 0.3
    llm.engine.overlap, deferred, begin = overlap, [], llm.engine._leave_running
    llm.engine._leave_running = lambda flight: (deferred.append(flight.sched.num_tokens), begin(flight))
    runner, propose = llm.engine.drafter.runner, llm.engine.drafter.runner.propose

    def drafting(requests, *a, **kw):  # the draft reads every token: none may still be pending
        assert not any(r.num_pending for r in requests)
        return propose(requests, *a, **kw)

    runner.propose = drafting
    rates, kinds = llm.engine.drafter.rates, []
    speculate = rates.speculate

    def recording(batch, *rest):
        choice = speculate(batch, *rest)
        kinds.append(choice[0])
        return choice

    rates.speculate = recording
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)] == demo_reference
    assert True in kinds and False in kinds
    assert (len(deferred) > 0) is overlap
    _assert_pools_free(llm)


@pytest.mark.slow
def test_deepspark_stops_drafting_what_it_would_not_verify(demo_reference):
    """Early stop spares the draft steps of drafts below min_value and changes nothing else: the
    same greedy tokens, the same drafts verified and accepted (every round the draft model's: no
    lookup, whose drafts may be shorter than k). (With sampling, fewer draft
    samples leave the draft's generator elsewhere, so sampled drafts differ; outputs stay samples
    of the target's distribution, which test_rejection_sampler_... checks.)"""
    runs = {}
    prompts = DEMO_PROMPTS
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for early in (True, False):
        llm = LLM(progress=False, dtype="float32", plugins=["deepspark"],
                  plugin_options={"deepspark": {"early_stop": early, "min_value": 0.4, "cost_aware": False,
                                                "skip_when_slower": "never", "lookup": False}})
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        runs[early] = outs, llm.get_metrics()
        _assert_pools_free(llm)
    (early_out, early_m), (full_out, full_m) = runs[True], runs[False]
    assert early_out == full_out == demo_reference
    for key in ("num_drafts", "num_verified_tokens", "num_accepted_tokens"):
        assert early_m[f"deepinfer:spec_decode_{key}"] == full_m[f"deepinfer:spec_decode_{key}"], key
    assert full_m["deepinfer:spec_decode_num_draft_tokens"] == 5 * full_m["deepinfer:spec_decode_num_drafts"]
    assert early_m["deepinfer:spec_decode_num_draft_tokens"] < full_m["deepinfer:spec_decode_num_draft_tokens"]


@pytest.mark.slow
def test_drafts_with_the_prefix_cache_stay_lossless(demo_reference):
    """Rejected drafts' KV must never reach a cached block: repeat the prompts to hit the cache."""
    llm = LLM(progress=False, dtype="float32", plugins=["prefix-cache", "deepspark"], block_size=4)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for _ in range(2):
        got = [o.outputs[0].token_ids for o in llm.generate(DEMO_PROMPTS, params, use_tqdm=False)]
        assert got == demo_reference
    # the continuations themselves are cached now: a prompt extended by its own output hits them
    longer = [{"prompt_token_ids": o.prompt_token_ids + o.outputs[0].token_ids[:40]}
              for o in llm.generate(DEMO_PROMPTS[:1], params, use_tqdm=False)]
    out = llm.generate(longer, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == demo_reference[0][40:48]
    assert out.num_cached_tokens >= 32
    llm.engine.kv.pool.check_all_free()
    llm.engine.drafter.runner.draft.pool.check_all_free()


@pytest.mark.slow
def test_draft_dtype_follows_the_option_and_stays_lossless(monkeypatch):
    """A bfloat16 target on the CPU gets a bfloat16 draft by default where deepinfer's bfloat16 kernel
    runs it (an AVX2 CPU without AVX-512) or torch's bfloat16 matmul is fast (an AVX-512 CPU), else
    a float32 one (torch's half-precision single-token steps are no faster), or the dtype asked for;
    the greedy tokens are the target's either way, up to near-ties:
    in bfloat16 a target step's logits vary in the last bit with the step's composition (a
    verification's rows against one-token steps; by how much depends on the CPU's kernels), which
    can flip a near-tie (one of these prompts has one 0.06 apart in logprob at its 20th token). So
    where the tokens part from no drafter's, the target must rate both tokens there within 0.25 in
    logprob. Float32 identity is tested above."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = LLM(progress=False, dtype="bfloat16")
    ref = base.generate(DEMO_PROMPTS[:2], params, use_tqdm=False)
    kernel = torch.bfloat16 if cpu.cpu_bf16.unavailable_reason() is None else torch.float32
    for slow, native, opts, dtype in ((False, False, {}, torch.float32), (True, False, {}, kernel),
                                      (False, True, {}, torch.bfloat16),
                                      (False, False, {"dtype": "bfloat16"}, torch.bfloat16)):
        monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda slow=slow: slow)
        monkeypatch.setattr(cpu, "native_bf16_matmul", lambda native=native: native)
        llm = LLM(progress=False, dtype="bfloat16", plugins=["deepspark"],
                  plugin_options={"deepspark": {**opts, "cost_aware": False}})
        runner = llm.engine.drafter.runner
        assert runner.draft.dtype == dtype and next(runner.draft.model.parameters()).dtype == dtype
        assert all(c.dtype == dtype for c in runner.draft.kv_caches)
        for want, got in zip(ref, llm.generate(DEMO_PROMPTS[:2], params, use_tqdm=False), strict=True):
            w, g = want.outputs[0].token_ids, got.outputs[0].token_ids
            if g != w:  # the first token that differs: a near-tie of the target's
                d = next(i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b)
                probe = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
                lp = base.generate([{"prompt_token_ids": want.prompt_token_ids + w[:d]}], probe,
                                   use_tqdm=False)[0].outputs[0].logprobs[0]
                assert w[d] in lp and g[d] in lp and abs(lp[w[d]] - lp[g[d]]) < 0.25, (d, w[d], g[d], lp)
        assert llm.get_metrics()["deepinfer:spec_decode_num_accepted_tokens"] > 0
        _assert_pools_free(llm)


@pytest.mark.slow
@pytest.mark.parametrize("early", [True, False])
def test_drafts_proposed_early_keep_text_stops_and_pools(early):
    """With ``early_propose`` the engine proposes the next step's drafts as soon as a step's tokens
    are taken (once a step), and makes the step's text after: the outputs (tokens, text, finish and
    stop reasons, stop strings included) stay no drafter's, and an abort while such drafts are
    pending frees them. (Off by default on the CPU, where drafting is done when propose returns.)"""
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, stop=["\n\n", "return"]),
              SamplingParams(temperature=0, max_tokens=40, stop=["self"], include_stop_str_in_output=True),
              SamplingParams(temperature=0, max_tokens=40)]

    def summary(outs):
        return [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in (o.outputs[0] for o in outs)]

    base = LLM(progress=False, dtype="float32")
    ref = summary(base.generate(DEMO_PROMPTS, params, use_tqdm=False))
    assert sum(isinstance(r[3], str) for r in ref) >= 1  # a stop string ended some request
    decode = base.get_tokenizer().decode
    for (tokens, text, _, stop), p in zip(ref, params, strict=True):  # the text against the tokenizer's
        full = decode(tokens, True)
        cut = full.find(stop) + (len(stop) if p.include_stop_str_in_output else 0) if isinstance(stop, str) else None
        assert text == full[:cut]
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"])
    eng = llm.engine
    assert eng.early_propose is False  # (a synchronous CPU)
    eng.early_propose = early
    pending, proposals, step, propose = [], [], eng.step, eng.drafter.propose

    def stepping():
        proposals.append(0)
        out = step()
        pending.append(any(s.draft is not None for st in eng.requests.values() for s in st.seqs))
        return out

    def proposing(requests):
        proposals[-1] += 1
        return propose(requests)

    eng.step, eng.drafter.propose = stepping, proposing
    assert summary(llm.generate(DEMO_PROMPTS, params, use_tqdm=False)) == ref
    assert max(proposals) == 1  # one proposal a step, early or not
    assert any(pending) is early  # drafts were waiting for the next step exactly when proposed early
    _assert_pools_free(llm)
    prompt = llm.get_tokenizer().encode(DEMO_PROMPTS[1])
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    eng.add_request("a", prompt, long)
    eng.add_request("b", prompt, long)
    for _ in range(30):
        eng.step()
        if pending[-1] or not early:
            break
    assert pending[-1] is early
    assert ("a" in eng.drafter.runner.seqs) is early  # (a late proposal's draft state is made at the next step)
    eng.abort_request("a")
    assert "a" not in eng.drafter.runner.seqs
    while eng.has_unfinished_requests():
        eng.step()
    _assert_pools_free(llm)


@pytest.mark.slow
def test_an_early_proposal_that_fails_raises_at_the_next_step():
    """A drafter error in an early proposal comes where the proposal used to run, at the next
    step's start: the step that made it still returns its outputs."""
    llm = LLM(progress=False, dtype="float32", plugins=["deepspark"])
    eng = llm.engine
    eng.early_propose = True
    prompt = llm.get_tokenizer().encode(DEMO_PROMPTS[0])
    eng.add_request("a", prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    eng.add_request("b", prompt, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    eng.step()  # the prompts, then an early proposal

    def failing(requests):
        raise RuntimeError("draft failed")

    eng.drafter.propose = failing
    outs = {o.request_id: o for o in eng.step()}  # "a" ends; the early proposal for "b" fails
    assert outs["a"].finished and len(outs["a"].outputs[0].token_ids) == 2
    with pytest.raises(RuntimeError, match="draft failed"):
        eng.step()

