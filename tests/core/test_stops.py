"""Stops as vLLM makes them: stop strings wait for min_tokens as EOS and stop token ids do, and a
stop token's own text is left out of the output unless include_stop_str_in_output."""
from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams

PROMPT = "import os\n"


@pytest.fixture(scope="module")
def demo():
    llm = LLM(dtype="float32", progress=False)
    free = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    return llm, free[0].outputs[0]


def test_stop_strings_wait_for_min_tokens(demo):
    """The greedy text holds newlines from its first tokens on; with stop "\\n" and min_tokens 10
    the output keeps its first 10 tokens' newlines and ends at the first newline after them."""
    llm, free = demo
    first_ten = llm.get_tokenizer().decode(free.token_ids[:10])
    assert "\n" in first_ten and "\n" in free.text[len(first_ten):]  # (the oracle's premise)
    early = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=["\n"]), use_tqdm=False)[0]
    assert early.outputs[0].text == free.text[:free.text.index("\n")]
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=["\n"], min_tokens=10),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 10 and out.finish_reason == "stop" and out.stop_reason == "\n"
    # the first newline that ends after the 10th token's text begins (the text before is never searched)
    search_from = len(llm.get_tokenizer().decode(free.token_ids[:9]))
    assert out.text == free.text[:free.text.index("\n", search_from)]
    assert out.token_ids == free.token_ids[:len(out.token_ids)]


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_adds_its_text_only_when_asked(demo, include):
    llm, free = demo
    stop = free.token_ids[5]
    cut = free.token_ids.index(stop) + 1  # (its first occurrence ends the request)
    params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop], include_stop_str_in_output=include)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids[:cut]  # the token itself stays among the ids
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == llm.get_tokenizer().decode(free.token_ids[:cut if include else cut - 1])
    assert llm.get_tokenizer().decode([stop]) != ""  # (else both cases would agree whatever the code)
