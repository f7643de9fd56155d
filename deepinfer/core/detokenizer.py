"""Incremental detokenization with stop strings: text grows as tokens arrive."""
from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer.core.tokenizer import Tokenizer


@dataclass(slots=True)
class IncrementalDetokenizer:
    """Decodes only a short window of tokens per step; holds back an unfinished UTF-8 character
    and any tail that could still become a stop string."""

    tokenizer: Tokenizer | None
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True
    #: stop strings end the text only from this many tokens on (the request's min_tokens): text
    #: made before then is never searched again, but for a stop string that ends after it
    min_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0
    stopped_by: str | None = None
    unread: bool = False  # tokens were deferred: the text does not cover them yet
    #: every end after read_offset up to this one gives no text yet (with these offsets): a read
    #: tries only later ends, so tokens that add no text (skipped special ones) are decoded once
    tried: int = 0

    def add(self, new_ids: list[int]) -> str | None:
        """Append tokens; returns the stop string if one appeared (the text is cut there)."""
        self.token_ids.extend(new_ids)
        return self._read(back_off=False)

    def defer(self, new_ids: list[int]) -> None:
        """Append tokens whose text is made only when it is read (``visible_text``), in one pass
        with any others deferred since: for text that decides nothing before then (no stop
        strings). The text is the same as from adding them one at a time, with decoders whose
        windows' texts join cleanly (byte-level BPE, SentencePiece's: the demo models')."""
        self.token_ids.extend(new_ids)
        self.unread = True

    def _read(self, back_off: bool) -> str | None:
        """Extend the text over the tokens not read yet, up to the last that ends a whole character;
        returns the stop string if one appeared. ``back_off``: if the last token does not end
        one, look for an earlier token that does (tokens added one at a time tried each already)."""
        self.unread = False
        if self.tokenizer is None or self.stopped_by is not None:
            return None
        n, known = len(self.token_ids), max(self.read_offset, self.tried)
        low = known if back_off else n - 1
        if low >= n:
            return None
        dec, skip = self.tokenizer.decode, self.skip_special_tokens
        prefix = dec(self.token_ids[self.prefix_offset:self.read_offset], skip)
        for end in range(n, low, -1):
            full = dec(self.token_ids[self.prefix_offset:end], skip)
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                break
        else:  # no text yet, or an incomplete character: wait for more tokens
            if known >= low:
                self.tried = n  # (and every end before n)
            return None
        before = len(self.text)
        self.text += full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = self.tried = end
        if self.stop and end >= self.min_tokens:
            return self._check_stop(before)
        return None

    def _check_stop(self, before: int) -> str | None:
        longest = max(len(s) for s in self.stop)
        start = max(0, before - longest + 1)
        hit, hit_at = None, len(self.text)
        for s in self.stop:
            i = self.text.find(s, start)
            if i != -1 and i < hit_at:
                hit, hit_at = s, i
        if hit is None:
            return None
        self.text = self.text[:hit_at + (len(hit) if self.include_stop else 0)]
        self.stopped_by = hit
        return hit

    def visible_text(self, finished: bool) -> str:
        """Text safe to show: while running, a tail that may begin a stop string is held back."""
        if self.unread:
            self._read(back_off=True)
        if finished or not self.stop:
            return self.text
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self.text[:len(self.text) - hold] if hold else self.text
