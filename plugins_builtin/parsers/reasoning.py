"""Reasoning parsers: a model's reasoning, between think tags, apart from its answer.

A reasoning parser is a class with a ``name`` and ``split(text, final)``: the reasoning and the
content of a completion's text so far. With ``final`` False the text may still grow, so a tag's
first characters at its end are held back (neither reasoning nor content yet); the server streams
the growth of each part between calls. Splits of a growing text only ever grow."""
from __future__ import annotations


def partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` begin one of ``tags`` (and might complete it)."""
    longest = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:k]):
                longest = k
                break
    return longest


class DeepSeekR1ReasoningParser:
    """DeepSeek-R1's format, as vLLM and SGLang read it: the reasoning runs up to ``</think>`` (its
    chat template opens ``<think>`` in the prompt, so the output may hold only the end tag; an opening
    tag in the output is dropped), and the answer follows. Until the end tag, all is reasoning."""

    name = "deepseek_r1"
    start = "<think>"
    end = "</think>"

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """(reasoning, content) of ``text``; either may be empty."""
        if not final:
            text = text[:len(text) - partial_tag(text, (self.start, self.end))]
        _, opened, rest = text.partition(self.start)
        if opened:
            text = rest
        reasoning, ended, content = text.partition(self.end)
        return (reasoning, content) if ended else (text, "")
