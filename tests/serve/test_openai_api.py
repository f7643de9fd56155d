"""Completions and chat through the official openai client, checked against the offline engine and transformers."""
from __future__ import annotations

import torch

from deepinfer.core.sampling_params import SamplingParams

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello world"}]


def offline_text(offline, prompt, **params) -> tuple[str, list[int]]:
    out = offline.generate(prompt, SamplingParams(**params), use_tqdm=False)[0].outputs[0]
    return out.text, out.token_ids


def hf_chat_ids(tiny_model, messages) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_completion_matches_offline_engine_greedy(client, offline):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    text, ids = offline_text(offline, PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == "length"
    assert r.object == "text_completion" and r.model == "tiny"
    tok = offline.get_tokenizer()
    assert r.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert r.usage.completion_tokens == len(ids) == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_completion_stream_equals_non_stream_and_reports_usage(client):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_usage_has_the_prompt_tokens_details_of_the_whole_reply(client):
    for create, kw in ((client.completions.create, {"prompt": PROMPT}),
                       (client.chat.completions.create, {"messages": MESSAGES})):
        whole = create(model="tiny", max_tokens=4, temperature=0, **kw).usage
        chunks = list(create(model="tiny", max_tokens=4, temperature=0, stream=True,
                             stream_options={"include_usage": True}, **kw))
        assert chunks[-1].usage == whole and whole.prompt_tokens_details.cached_tokens == 0


def test_chat_uses_chat_template_and_matches_transformers_tokenization(client, offline, tiny_model):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    ids = hf_chat_ids(tiny_model, MESSAGES)
    assert r.usage.prompt_tokens == len(ids)
    want = offline.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=10, temperature=0),
                            use_tqdm=False)[0].outputs[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.choices[0].finish_reason == want.finish_reason


def test_chat_stream_equals_non_stream(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_completion_tokens": 24, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_n2_returns_two_distinct_samples_with_usage_of_both(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, n=2,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.choices[0].text != r.choices[1].text
    assert r.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, n=2, seed=3,
                                                 stream=True, extra_body={"ignore_eos": True}))
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    finished = [ch.index for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(finished) == [0, 1] and texts[0] != texts[1]


def test_stop_string_cuts_the_text_streamed_or_not(client):
    base = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[10:13]
    assert stop and len(base) > 13
    want = base[:base.find(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == want


def test_seed_reproduces_the_same_texts(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "temperature": 1.0, "n": 2,
          "extra_body": {"ignore_eos": True}}
    a = client.chat.completions.create(**kw, seed=1234)
    b = client.chat.completions.create(**kw, seed=1234)
    c = client.chat.completions.create(**kw, seed=99)
    def texts(r):
        return [ch.message.content for ch in sorted(r.choices, key=lambda x: x.index)]

    assert texts(a) == texts(b)
    assert texts(a) != texts(c)


def test_top_k_1_sampling_equals_greedy(client):
    greedy = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    topk = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.5,
                                     extra_body={"top_k": 1})
    assert topk.choices[0].text == greedy.choices[0].text


def test_penalties_reach_the_engine(client, offline):
    params = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
    plain, _ = offline_text(offline, PROMPT, **params)
    penalised, _ = offline_text(offline, PROMPT, presence_penalty=1.5, frequency_penalty=2.0, **params)
    assert plain != penalised  # the prompt repeats tokens, so the penalties must change it
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, presence_penalty=1.5,
                                  frequency_penalty=2.0, extra_body={"ignore_eos": True})
    assert r.choices[0].text == penalised


def _hf_logprobs(tiny_model, prompt_ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    ids = list(prompt_ids)
    rows = []
    with torch.no_grad():
        for _ in range(n):
            row = model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
            rows.append(row)
            ids.append(int(row.argmax()))
    return ids[len(prompt_ids):], rows


def test_chat_logprobs_with_top_logprobs_match_transformers(client, tiny_model):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    tokens, rows = _hf_logprobs(tiny_model, hf_chat_ids(tiny_model, MESSAGES), 6)
    for pos, (tok_id, row) in enumerate(zip(tokens, rows, strict=True)):
        entry = content[pos]
        assert abs(entry.logprob - float(row[tok_id])) < 1e-3
        assert len(entry.top_logprobs) == 3
        top_vals = [t.logprob for t in entry.top_logprobs]
        assert top_vals == sorted(top_vals, reverse=True)
        want = row.topk(3).values.tolist()
        assert all(abs(a - b) < 1e-3 for a, b in zip(top_vals, want, strict=True))
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the sampled token is the likeliest


def test_completion_logprobs_stream_and_non_stream_agree(client, tiny_model, offline):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2,
          "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw).choices[0].logprobs
    assert len(full.tokens) == len(full.token_logprobs) == len(full.top_logprobs) == 5
    prompt_ids = offline.get_tokenizer().encode(PROMPT)
    _, rows = _hf_logprobs(tiny_model, prompt_ids, 5)
    for lp, row in zip(full.token_logprobs, rows, strict=True):
        assert abs(lp - float(row.max())) < 1e-3
    for tok, lp, top in zip(full.tokens, full.token_logprobs, full.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and top[tok] == lp == max(top.values())
    streamed = [lp for c in client.completions.create(**kw, stream=True) for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == full.token_logprobs


def test_token_id_prompts_and_prompt_batches(client, offline):
    tok = offline.get_tokenizer()
    ids = tok.encode(PROMPT)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model="tiny", prompt=[PROMPT, "import os"], max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text
    assert batch.usage.prompt_tokens == len(ids) + len(tok.encode("import os"))


def test_models_lists_the_served_name_and_the_context(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].model_extra["max_model_len"] == 256


def test_streamed_text_offsets_count_text_held_back():
    """Three steps of one token each, "ab", "cd", "e", under a stop string "b\\x01": the first step
    shows "a" and holds "b" back (it may begin the stop string). The streamed offsets are still
    each token's place in the text, 0, 2, 4, as a whole reply's are."""
    import asyncio
    import json

    from deepinfer.serve.completions import _Shape, _stream
    from deepinfer.serve.engine_core import RequestDelta, SeqDelta
    from deepinfer.serve.serving import Serving

    strings = {1: "ab", 2: "cd", 3: "e"}
    steps = [("a", 1, None), ("bcd", 2, None), ("e", 3, "length")]

    class Sub:  # a submission whose engine steps arrive one at a time
        done = False

        async def next_batch(self):
            text, token, finish = steps.pop(0)
            self.done = not steps
            seq = SeqDelta(0, [token], text, [{token: -0.5}], finish, None)
            return [(0, RequestDelta("r-0", finish is not None, [seq], 0))]

    serving = type("Serving", (), {"token_str": staticmethod(strings.__getitem__), "top": staticmethod(Serving.top)})()
    shape = _Shape(n=1, prompt_ids=[[1]], echo_texts=None, echo_only=False, logprobs=0, prompt_logprobs=None)

    async def events():
        return [e async for e in _stream(serving, Sub(), "r", "tiny", shape, 3, False)]

    chunks = [json.loads(line[len("data: "):]) for e in asyncio.run(events()) for line in e.split("\n\n")
              if line.startswith("data: {")]
    texts = [c["choices"][0]["text"] for c in chunks]
    offsets = [c["choices"][0]["logprobs"]["text_offset"] for c in chunks]
    assert texts == ["a", "bcd", "e"] and offsets == [[0], [2], [4]]


def test_more_sequences_than_the_server_ever_holds_is_a_400_not_a_503(client):
    import openai

    # (the shared server holds 4 running + 4 waiting sequences)
    try:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, n=9)
    except openai.BadRequestError as e:
        assert e.body["param"] == "n" and "at most 8" in e.body["message"]
    else:
        raise AssertionError("a request of 9 sequences was accepted by a server that holds 8")



def test_chat_chunks_carry_only_their_fields(server):
    """As OpenAI's and vLLM's: the role only in the first chunk's delta, no null fields; the
    finish chunk's delta may be empty."""
    import json

    import httpx

    from tests.serve.conftest import API_KEY

    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True,
            "ignore_eos": True}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    deltas = [json.loads(line[len("data: "):])["choices"][0]["delta"] for line in r.text.splitlines()
              if line.startswith("data: {")]
    # (a loaded machine may merge every token into one chunk: a slow reader gets fewer, larger ones)
    assert deltas[0].get("role") == "assistant" and len(deltas) >= 2
    assert all("role" not in d for d in deltas[1:])
    assert all(None not in d.values() for d in deltas)
