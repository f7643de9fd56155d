"""The deepseek_r1 reasoning parser on fixed outputs, whole and streamed in every split of the text
into deltas: the streamed parts, joined, are the whole text's parts (the oracle), and no delta shows
a tag or a piece of one."""
from __future__ import annotations

import pytest

from deepinfer.serve.parsers import REASONING_GROUP, ReasoningStream, load_parser
from deepinfer_builtin.parsers.reasoning import DeepSeekR1ReasoningParser, partial_tag

CASES = [  # (text, reasoning, content), as vLLM's DeepSeekR1ReasoningParser splits them
    ("<think>I add 2 and 2.</think>It is 4.", "I add 2 and 2.", "It is 4."),
    ("I add 2 and 2.</think>It is 4.", "I add 2 and 2.", "It is 4."),  # the template opened <think>
    ("<think>still thinking", "still thinking", ""),                    # cut before the end tag
    ("no tags at all", "no tags at all", ""),
    ("<think></think>", "", ""),
    ("<think>a</think>b</think>c", "a", "b</think>c"),                  # only the first end tag splits
    ("<think>x < y and </thin k</think>ok", "x < y and </thin k", "ok"),
]


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_whole_outputs_split_at_the_end_tag(text, reasoning, content):
    assert DeepSeekR1ReasoningParser().split(text) == (reasoning, content)


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_streamed_deltas_join_to_the_whole_split_in_every_chunking(text, reasoning, content):
    parser = DeepSeekR1ReasoningParser()
    for size in range(1, len(text) + 1):
        stream = ReasoningStream(parser)
        got_r, got_c = [], []
        chunks = [text[i:i + size] for i in range(0, len(text), size)]
        for i, chunk in enumerate(chunks):
            r, c = stream.feed(chunk, final=i == len(chunks) - 1)
            got_r.append(r)
            got_c.append(c)
        assert ("".join(got_r), "".join(got_c)) == (reasoning, content), size


def test_a_tag_cut_between_deltas_is_held_back_until_it_completes():
    stream = ReasoningStream(DeepSeekR1ReasoningParser())
    assert stream.feed("<think>why</th", False) == ("why", "")
    assert stream.feed("ink>so", False) == ("", "so")
    assert stream.feed("</", False) == ("", "")
    assert stream.feed("", True) == ("", "</")  # the end: nothing is held back any more


def test_partial_tag_counts_the_longest_beginning_of_a_tag():
    assert partial_tag("abc</thi", ("<think>", "</think>")) == 5
    assert partial_tag("abc<", ("<think>", "</think>")) == 1
    assert partial_tag("abc</think>", ("<think>", "</think>")) == 0


def test_the_parser_is_found_by_name_and_an_unknown_name_lists_the_installed():
    assert load_parser(REASONING_GROUP, "deepseek_r1", "--reasoning-parser").name == "deepseek_r1"
    with pytest.raises(ValueError, match="installed: .*deepseek_r1"):
        load_parser(REASONING_GROUP, "nope", "--reasoning-parser")
