"""Structured output: a request's constraint compiled to a grammar (xgrammar, as vLLM and SGLang use)
and each sequence's state in it, which masks the tokens the grammar forbids before sampling.

A grammar is parsed from ``StructuredOutputsParams`` without the tokenizer (``parse``: what the
server checks before it admits a request), then compiled once for the model's vocabulary
(``Grammars.compile``, kept for requests that ask again). Each sequence holds a ``GrammarState``:
the sampler fills its row of a bitmask (``fill``) on the host while the step's forward runs on the
device, and the request table advances it by every token the sequence gains (``accept``). For a
verification, the rows of a sequence's drafts come from its state advanced through the drafts and
rolled back (``fill_drafts``), so a draft the grammar forbids has probability 0 and is rejected.
"""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from deepinfer.core.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from deepinfer.core.request import Request
    from deepinfer.core.tokenizer import Tokenizer


class GrammarError(ValueError):
    """A constraint that cannot be turned into a grammar (the message names the problem)."""


def _xgr():
    import xgrammar

    return xgrammar


def parse(spec: StructuredOutputsParams) -> Any:
    """The constraint as an ``xgrammar.Grammar`` (no tokenizer needed); GrammarError naming the
    problem when the schema, expression or grammar is not valid."""
    xgr = _xgr()
    kind = spec.kind
    try:
        if kind == "json_object":  # (OpenAI's json_object: an object, whatever its keys)
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if kind == "json_schema":
            schema = spec.json_schema if isinstance(spec.json_schema, str) else json.dumps(spec.json_schema)
            return _json_strings(xgr, xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
        if kind == "regex":
            return xgr.Grammar.from_regex(spec.regex)
        if kind == "choice":  # (JSON's string escapes are EBNF's)
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
        return xgr.Grammar.from_ebnf(spec.grammar)
    except Exception as e:  # noqa: BLE001 - xgrammar raises several kinds for a bad input
        what = {"json_schema": "JSON schema", "regex": "regular expression", "choice": "choice",
                "grammar": "EBNF grammar", "json_object": "JSON grammar"}[kind]
        raise GrammarError(f"the {what} of structured_outputs cannot be compiled: {_first_line(e)}") from None


#: xgrammar 0.2's rule for one character of a string with ``minLength`` or ``maxLength`` takes any
#: character but a quote, a backslash, CR and LF: raw control characters pass (JSON forbids them in
#: strings; json.loads refuses them) and escapes do not. Such a rule is given what its unbounded
#: strings take instead: a character that is not a control character, quote or backslash, or an escape.
_BOUNDED_CHARACTER = re.compile(r'^(\w+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
_JSON_CHARACTER = r'\1 ::= (([^\\0-\\x1f\\"\\\\]) | ("\\\\" ([\\"\\\\/bfnrt] | "u" [A-Fa-f0-9]{4})))'


def _json_strings(xgr: Any, grammar: Any) -> Any:
    """``grammar`` (from a JSON schema) with every bounded string's characters as JSON allows them."""
    text = str(grammar)
    fixed = _BOUNDED_CHARACTER.sub(_JSON_CHARACTER, text)
    return grammar if fixed == text else xgr.Grammar.from_ebnf(fixed)


def _first_line(e: BaseException) -> str:
    """xgrammar's message without its log prefix (``[19:31:40] /project/cpp/file.cc:94: ``)."""
    text = (str(e).strip() or type(e).__name__).splitlines()[0][:2000]
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text)


class Grammars:
    """Compiles constraints for one model's vocabulary, and keeps the last ``capacity`` compiled."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int],
                 capacity: int = 64) -> None:
        xgr = _xgr()
        vocab = tokenizer.vocab()
        size = max(vocab_size, max(vocab.values()) + 1)
        encoded = [""] * size
        for token, i in vocab.items():
            encoded[i] = token
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.backend_json())
        self.stop_token_ids = sorted(stop_token_ids)
        self.info = xgr.TokenizerInfo(encoded[:vocab_size], meta["vocab_type"], vocab_size=vocab_size,
                                      stop_token_ids=self.stop_token_ids or None,
                                      add_prefix_space=meta["add_prefix_space"])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self.vocab_size = vocab_size
        self.capacity = capacity
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    def compile(self, spec: StructuredOutputsParams) -> Any:
        key = spec.model_dump_json()
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            return hit
        compiled = self.compiler.compile_grammar(parse(spec))
        self._compiled[key] = compiled
        if len(self._compiled) > self.capacity:
            self._compiled.popitem(last=False)
        return compiled

    def state(self, compiled: Any) -> GrammarState:
        """A fresh state at the grammar's start, for one sequence."""
        xgr = _xgr()
        # (a model without stop tokens ends a sequence when its grammar is complete)
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=not self.stop_token_ids)
        return GrammarState(matcher, self.vocab_size)


class GrammarState:
    """One sequence's place in its grammar: which tokens may come next, advanced token by token."""

    __slots__ = ("matcher", "vocab_size")

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (and no change) when the grammar forbids it."""
        return self.matcher.accept_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing may follow (its stop token was accepted)."""
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row ``row`` of ``bitmask`` (int32 [B, ceil(V/32)], on the host): the tokens allowed next."""
        if self.matcher.is_terminated():
            bitmask[row] = -1  # (a sequence that still computes after its end: anything, it is dropped)
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def fill_drafts(self, bitmask: torch.Tensor, row: int, drafts: Sequence[int]) -> None:
        """Rows ``row`` .. ``row + len(drafts)``: the tokens allowed at each draft's place and after
        the last, the state advanced through the drafts and rolled back. Past a draft the grammar
        forbids, rows allow everything: that draft is rejected, and nothing after it is read."""
        accepted = 0
        for j in range(len(drafts) + 1):
            if j > accepted:  # (a draft before this place was forbidden)
                bitmask[row + j] = -1
                continue
            self.fill(bitmask, row + j)
            if j < len(drafts) and self.accept(drafts[j]):
                accepted += 1
        if accepted:
            self.matcher.rollback(accepted)


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask of ``rows`` rows that allows every token (-1: every bit set)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


_BITS = None


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | None = None) -> None:
    """Set to -inf, in place, every logit of ``logits`` [B, V] whose bit is clear in ``bitmask``
    (int32 [B or len(rows), ceil(V/32)], on the host): for all rows, or row ``rows[i]`` of the logits
    by row i of the mask. The mask goes to the logits' device in one copy that waits for nothing."""
    global _BITS
    if _BITS is None or _BITS.device != logits.device:
        _BITS = torch.arange(32, dtype=torch.int32, device=logits.device)
    pinned = logits.device.type == "cuda"
    mask = (bitmask.pin_memory() if pinned else bitmask).to(logits.device, non_blocking=True)
    allowed = ((mask[:, :, None] >> _BITS) & 1).bool().flatten(1)[:, :logits.shape[-1]]
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        index = torch.tensor(list(rows), dtype=torch.long).to(logits.device, non_blocking=True)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def constrained_rows(requests: Sequence[Request]) -> list[int]:
    """The rows of ``requests`` whose sequence follows a grammar."""
    return [i for i, r in enumerate(requests) if r.grammar is not None]


def mask_rows(logits: torch.Tensor, requests: Sequence[Request]) -> None:
    """Mask, in place, the logits [B, V] of every request of the batch that follows a grammar (one
    row a request) with the tokens its grammar allows next: filled on the host (while the device
    still computes what the logits come from) and applied in one copy and a few batched ops."""
    rows = constrained_rows(requests)
    if not rows:
        return
    bitmask = new_bitmask(len(rows), logits.shape[-1])
    fill_rows(bitmask, [requests[row].grammar for row in rows])
    apply_bitmask(logits, bitmask, rows)


#: rows from which a bitmask is filled by xgrammar's thread pool rather than row by row here (below
#: it, handing the rows to the threads costs about what it saves)
BATCH_FILL_ROWS = 4
_BATCH = None


def fill_rows(bitmask: torch.Tensor, states: Sequence[GrammarState]) -> None:
    """Row i of ``bitmask`` (allowing every token where it is given) from ``states[i]``, as
    ``GrammarState.fill`` does; many rows at once on xgrammar's threads, which leave the GIL (the
    fill of one JSON-schema row takes tens of microseconds, and a batch holds hundreds)."""
    global _BATCH
    live = [i for i, s in enumerate(states) if not s.matcher.is_terminated()]  # (the others allow all)
    if len(live) < BATCH_FILL_ROWS:
        for i in live:
            states[i].matcher.fill_next_token_bitmask(bitmask, i)
        return
    if _BATCH is None:
        _BATCH = _xgr().BatchGrammarMatcher()
    _BATCH.batch_fill_next_token_bitmask([states[i].matcher for i in live], bitmask, live)


def mask_drafts(logits: torch.Tensor, verifying: Sequence[tuple[Request, list[int], int]]) -> None:
    """Mask, in place, the verification logits (each request's rows one after the other: its drafts'
    places and the one after the last) of the requests that follow a grammar, from their grammar
    states advanced through the drafts (``GrammarState.fill_drafts``)."""
    bitmask = new_bitmask(len(logits), logits.shape[-1])
    at = 0
    for r, drafts, _ in verifying:
        if r.grammar is not None:
            if r.draft is not None and r.draft.source is not None:  # (the values of drafts still on the device)
                drafts = r.draft.source.resolve(drafts)
            r.grammar.fill_drafts(bitmask, at, drafts)
        at += len(drafts) + 1
    apply_bitmask(logits, bitmask)
