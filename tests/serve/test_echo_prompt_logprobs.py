"""Completions' echo, vLLM's prompt_logprobs and streamed usage details, checked against the
offline engine (deepinfer.llm.LLM), transformers' log-softmax over the prompt, and the same
request without echo or without stream."""
from __future__ import annotations

from itertools import accumulate

import httpx
import pytest
import torch

from deepinfer.core.sampling_params import SamplingParams
from tests.serve.conftest import API_KEY

PROMPT = "The quick brown fox"
PROMPTS = [PROMPT, "import os"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello world"}]
GREEDY = {"model": "tiny", "temperature": 0, "extra_body": {"ignore_eos": True}}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60)


def close(a: list[float | None], b: list[float | None], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all((x is None and y is None) or abs(x - y) < tol for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def hf_rows(tiny_model):
    """transformers' log-softmax over a prompt's logits: row i - 1 scores prompt token i."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()

    def rows(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)

    return rows


# -------------------------------------------------------------------------------------------- echo
def test_echo_text_is_the_prompt_then_the_same_completion(client):
    plain = client.completions.create(prompt=PROMPT, max_tokens=10, **GREEDY)
    echoed = client.completions.create(prompt=PROMPT, max_tokens=10, echo=True, **GREEDY)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.usage == plain.usage  # the echoed prompt is no completion token


def test_echo_of_token_ids_is_their_decoded_text(client, offline):
    tok = offline.get_tokenizer()
    ids = tok.encode(PROMPT)
    assert tok.decode(ids, False) == PROMPT  # (this byte-level tokenizer round-trips)
    plain = client.completions.create(prompt=ids, max_tokens=6, **GREEDY)
    echoed = client.completions.create(prompt=ids, max_tokens=6, echo=True, **GREEDY)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text


def test_echo_logprobs_cover_the_prompt_then_the_completion(client, offline, hf_rows):
    tok = offline.get_tokenizer()
    ids = tok.encode(PROMPT)
    n = len(ids)
    plain = client.completions.create(prompt=PROMPT, max_tokens=5, logprobs=2, **GREEDY).choices[0].logprobs
    r = client.completions.create(prompt=PROMPT, max_tokens=5, logprobs=2, echo=True, **GREEDY).choices[0]
    lp = r.logprobs
    assert lp.tokens[:n] == [tok.decode([i], False) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    rows = hf_rows(ids)
    for i in range(1, n):
        assert abs(lp.token_logprobs[i] - float(rows[i - 1, ids[i]])) < 1e-4
        top = lp.top_logprobs[i]
        assert top[lp.tokens[i]] == lp.token_logprobs[i] and len(top) <= 3
        seen = {lp.tokens[i]}  # (ids that share a string, partial UTF-8, share one key: the first's)
        for t in rows[i - 1].topk(2).indices.tolist():
            s = tok.decode([t], False)
            if s not in seen:
                seen.add(s)
                assert abs(top[s] - float(rows[i - 1, t])) < 1e-4
        assert set(top) == seen
    assert lp.tokens[n:] == plain.tokens
    assert close(lp.token_logprobs[n:], plain.token_logprobs)
    # offsets run over the echoed text: the prompt's tokens spell it, the completion's follow it
    assert lp.text_offset == list(accumulate([0, *(len(t) for t in lp.tokens[:-1])]))
    assert all(r.text[o:o + len(t)] == t for o, t in zip(lp.text_offset[:n], lp.tokens[:n], strict=True))
    assert lp.text_offset[n] == len(PROMPT)


def test_echo_with_n_and_prompt_lists_streamed_equals_whole(client):
    kw = {"prompt": PROMPTS, "n": 2, "max_tokens": 6, "logprobs": 1, "echo": True, **GREEDY}
    whole = client.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    firsts, texts, tokens, lps, offsets = {}, {}, {}, {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            firsts.setdefault(c.index, c)
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.logprobs.tokens)
            lps.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
            offsets.setdefault(c.index, []).extend(c.logprobs.text_offset)
    for c in whole.choices:
        prompt = PROMPTS[c.index // 2]  # choice i * n + j: sample j of prompt i
        assert c.text.startswith(prompt) and c.logprobs.token_logprobs[0] is None
        first = firsts[c.index]  # the prompt and its logprobs come in a choice's first chunk
        assert first.text.startswith(prompt) and first.logprobs.token_logprobs[0] is None
        assert "".join(first.logprobs.tokens).startswith(prompt)
        assert texts[c.index] == c.text and tokens[c.index] == c.logprobs.tokens
        assert close(lps[c.index], c.logprobs.token_logprobs) and offsets[c.index] == c.logprobs.text_offset
    assert chunks[-1].usage == whole.usage


def test_echo_with_max_tokens_0_returns_the_prompt_alone(client, offline):
    ids = offline.get_tokenizer().encode(PROMPT)
    r = client.completions.create(prompt=PROMPT, max_tokens=0, echo=True, logprobs=0, **GREEDY)
    c = r.choices[0]
    assert c.text == PROMPT and len(c.logprobs.tokens) == len(ids) and c.logprobs.token_logprobs[0] is None
    assert r.usage.completion_tokens == 0 and c.finish_reason == "length"
    chunks = list(client.completions.create(prompt=PROMPT, max_tokens=0, echo=True, logprobs=0, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(ch.text for chunk in chunks for ch in chunk.choices) == PROMPT
    assert [t for chunk in chunks for ch in chunk.choices for t in ch.logprobs.tokens] == c.logprobs.tokens
    assert chunks[-1].usage.completion_tokens == 0


def test_echo_with_max_tokens_0_ends_length_whatever_the_dropped_token(client, offline):
    """The engine samples one token that max_tokens 0 drops: a stop token id equal to it (the greedy
    first token) must not make the prompt-only choice end with "stop"."""
    token = offline.generate(PROMPT, SamplingParams(max_tokens=1, temperature=0.0))[0].outputs[0].token_ids[0]
    body = {**GREEDY, "extra_body": {"stop_token_ids": [token]}}
    stopped = client.completions.create(prompt=PROMPT, max_tokens=1, **body).choices[0]
    assert stopped.finish_reason == "stop"  # (the stop does end the dropped token)
    for stream in (False, True):
        r = client.completions.create(prompt=PROMPT, max_tokens=0, echo=True, stream=stream, **body)
        choices = [ch for chunk in r for ch in chunk.choices] if stream else r.choices
        assert [ch.finish_reason for ch in choices if ch.finish_reason] == ["length"]
        assert all(getattr(ch, "stop_reason", None) is None for ch in choices)


# --------------------------------------------------------------------------------- prompt_logprobs
def _assert_vllm_prompt_logprobs(got: list, want: list, tok, k: int) -> None:
    """vLLM's format: None first, then by token id string the prompt token itself and the k
    likeliest, each {"logprob", "rank", "decoded_token"}; values and ranks as the offline engine's,
    whose ranks the k likeliest take 1..k of."""
    assert got[0] is None and want[0] is None and len(got) == len(want)
    for g, w in zip(got[1:], want[1:], strict=True):
        assert next(iter(g)) == str(next(iter(w))) and set(g) == {str(t) for t in w} and len(g) in (k, k + 1)
        assert sorted(g[str(t)]["rank"] for t in w if t != next(iter(w)) or len(w) == k) == list(range(1, k + 1))
        for t, v in w.items():
            entry = g[str(t)]
            assert set(entry) == {"logprob", "rank", "decoded_token"}
            assert abs(entry["logprob"] - v) < 1e-5 and entry["rank"] == w.rank_of(t) and entry["rank"] >= 1
            assert entry["decoded_token"] == tok.decode([t], False)


def test_completion_prompt_logprobs_match_the_offline_engine_per_prompt(server, offline):
    tok = offline.get_tokenizer()
    body = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": 3, "temperature": 0, "prompt_logprobs": 3}
    choices = post(server, "/v1/completions", body).json()["choices"]
    for c in choices:
        want = offline.generate(PROMPTS[c["index"] // 2], SamplingParams(max_tokens=1, prompt_logprobs=3),
                                use_tqdm=False)[0].prompt_logprobs
        _assert_vllm_prompt_logprobs(c["prompt_logprobs"], want, tok, 3)
    plain = post(server, "/v1/completions", {**body, "prompt_logprobs": None}).json()["choices"]
    assert all("prompt_logprobs" not in c for c in plain)


def test_prompt_logprobs_and_echo_logprobs_each_keep_their_own_count(server, offline):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 1,
            "prompt_logprobs": 4}
    c = post(server, "/v1/completions", body).json()["choices"][0]
    n = len(offline.get_tokenizer().encode(PROMPT))
    assert all(len(top) <= 2 for top in c["logprobs"]["top_logprobs"][1:n])
    assert all(len(row) in (4, 5) for row in c["prompt_logprobs"][1:])
    for i, row in enumerate(c["prompt_logprobs"][1:], start=1):  # the two views of one position agree
        token = next(iter(row))
        assert row[token]["logprob"] == c["logprobs"]["token_logprobs"][i]


def test_chat_prompt_logprobs_are_on_the_response_as_vllms(server, offline, tiny_model):
    from transformers import AutoTokenizer

    ids = list(AutoTokenizer.from_pretrained(str(tiny_model)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "temperature": 0, "prompt_logprobs": 2}
    r = post(server, "/v1/chat/completions", body).json()
    want = offline.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=2),
                            use_tqdm=False)[0].prompt_logprobs
    _assert_vllm_prompt_logprobs(r["prompt_logprobs"], want, offline.get_tokenizer(), 2)
    assert "prompt_logprobs" not in r["choices"][0]
    plain = post(server, "/v1/chat/completions", {**body, "prompt_logprobs": None}).json()
    assert "prompt_logprobs" not in plain


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": PROMPT}),
                                       ("/v1/chat/completions", {"messages": MESSAGES})])
def test_prompt_logprobs_with_stream_or_out_of_range_is_400(server, path, body):
    base = {"model": "tiny", "max_tokens": 2, **body}
    for extra in ({"prompt_logprobs": 1, "stream": True}, {"prompt_logprobs": 0, "stream": True},
                  {"prompt_logprobs": 21}, {"prompt_logprobs": -1}):
        r = post(server, path, {**base, **extra})
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == "prompt_logprobs" and "prompt_logprobs" in err["message"]


def test_max_tokens_0_needs_echo_and_no_min_tokens(server):
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert "echo" in r.json()["error"]["message"]
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 0, "echo": True,
                                         "min_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
