"""Incremental text equals a full decode; stop strings cut the text, even across tokens."""
from __future__ import annotations

import random

import pytest

from deepinfer.core.detokenizer import IncrementalDetokenizer
from deepinfer.core.tokenizer import Tokenizer
from tests.tiny_models import make_tokenizer

TEXT = "def read_config(path):\n    return 'Über naïve café 日本語 🙂'\n"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    make_tokenizer(path)
    return Tokenizer(path)


def test_incremental_text_equals_full_decode(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    for i in ids:
        d.add([i])
        assert TEXT.startswith(d.text)  # never shows a broken character
    assert d.text == tok.decode(ids) == TEXT


@pytest.mark.parametrize("seed", range(8))
def test_deferred_tokens_decoded_when_read_give_the_same_text(tok, seed):
    ids = tok.encode(TEXT, add_special_tokens=False)
    rng = random.Random(seed)
    d = IncrementalDetokenizer(tok)
    i = 0
    while i < len(ids):
        n = rng.randint(1, 6)
        before = d.text
        d.defer(ids[i:i + n])
        i += n
        assert d.text == before  # nothing decoded until the text is read
        if rng.random() < 0.4:
            shown = d.visible_text(finished=False)
            assert TEXT.startswith(shown)
    assert d.visible_text(finished=True) == TEXT
    assert d.token_ids == ids


def test_deferred_text_cut_inside_a_character_equals_one_at_a_time(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    cuts_inside = 0
    for m in range(1, len(ids) + 1):
        one = IncrementalDetokenizer(tok)
        for i in ids[:m]:
            one.add([i])
        later = IncrementalDetokenizer(tok)
        later.defer(ids[:m])
        assert later.visible_text(finished=True) == one.text
        cuts_inside += not TEXT.startswith(tok.decode(ids[:m]))
    assert cuts_inside > 0  # some cuts end inside a character, whose bytes are held back


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_text(tok, include):
    ids = tok.encode(TEXT, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, stop=("café",), include_stop=include)
    hit = None
    for i in ids:
        hit = d.add([i])
        if hit:
            break
    assert hit == "café"
    cut = TEXT.index("café") + (len("café") if include else 0)
    assert d.text == TEXT[:cut]


def test_visible_text_holds_back_a_possible_stop_prefix(tok):
    d = IncrementalDetokenizer(tok, stop=("STOP!",))
    d.text = "hello ST"
    assert d.visible_text(finished=False) == "hello "
    assert d.visible_text(finished=True) == "hello ST"


def test_chat_template_renders_like_transformers(tmp_path):
    from transformers import AutoTokenizer

    make_tokenizer(tmp_path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    ours = Tokenizer(tmp_path).apply_chat_template(msgs, add_generation_prompt=True)
    hf = AutoTokenizer.from_pretrained(str(tmp_path)).apply_chat_template(msgs, add_generation_prompt=True,
                                                                          tokenize=False)
    assert ours == hf
