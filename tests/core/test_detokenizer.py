"""Incremental text equals a full decode; stop strings cut the text, even across tokens."""
from __future__ import annotations

import random

import pytest

from deepinfer.core.detokenizer import IncrementalDetokenizer
from deepinfer.core.tokenizer import Tokenizer
from tests.tiny_models import SPECIALS, make_tokenizer

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


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_deferred_tokens_read_now_and_then_show_what_one_at_a_time_shows(tok, seed, skip):
    rng = random.Random(seed)
    specials = [tok._tok.token_to_id(t) for t in SPECIALS]
    ids = []
    for t in tok.encode(TEXT, add_special_tokens=False):
        ids.append(t)
        if rng.random() < 0.15:
            ids.extend(rng.choices(specials, k=rng.randint(1, 3)))
    ids += rng.choices(specials, k=12)  # a tail that adds no text (with skip)
    one = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    later = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    i = reads = 0
    while i < len(ids):
        chunk = ids[i:i + rng.randint(1, 6)]
        i += len(chunk)
        for t in chunk:
            one.add([t])
        before = later.text
        later.defer(chunk)
        assert later.text == before  # nothing decoded until the text is read
        if rng.random() < 0.4:
            assert later.visible_text(finished=False) == one.text
            reads += 1
    assert later.visible_text(finished=True) == one.text == tok.decode(ids, skip)
    assert later.token_ids == ids and reads > 3
    if skip:
        assert one.text == TEXT


def test_tokens_that_add_no_text_are_decoded_once_however_often_read(tok):
    calls = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return tok.decode(ids, skip_special_tokens)

    end = tok._tok.token_to_id(SPECIALS[1])
    d = IncrementalDetokenizer(Counting())
    d.defer(tok.encode("hello", add_special_tokens=False))
    assert d.visible_text(finished=False) == "hello"
    calls.clear()
    for _ in range(300):  # a model that goes on after its answer with tokens skipped in the text
        d.defer([end])
        assert d.visible_text(finished=False) == "hello"
    assert len(calls) <= 2 * 300  # the window's prefix and its one new end, a read


def test_without_a_tokenizer_deferred_tokens_are_kept_and_give_no_text():
    d = IncrementalDetokenizer(None)
    d.defer([5, 6])
    assert d.visible_text(finished=True) == "" and d.token_ids == [5, 6]


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
