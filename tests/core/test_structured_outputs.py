"""Structured outputs: every token a grammar forbids is masked before sampling, each sequence's
grammar state follows its own tokens, and the request ends when its grammar is complete.

Oracles: jsonschema validates JSON outputs against their schema, ``re.fullmatch`` checks regex
outputs, and xgrammar's own matcher, fed a sequence's tokens from scratch, accepts every one and
ends terminated. Speculative decoding must stay lossless under a grammar: greedy constrained
outputs with a drafter equal those without one."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from deepinfer import DEMO_MODEL, LLM, SamplingParams
from deepinfer.core.grammar import BATCH_FILL_ROWS, GrammarError, Grammars, fill_rows, new_bitmask, parse
from deepinfer.core.sampling_params import StructuredOutputsParams
from deepinfer.core.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                    "vip": {"type": "boolean"}},
                  "required": ["id", "vip"], "additionalProperties": False},
    },
    "required": ["name", "kind", "age", "tags", "owner"],
    "additionalProperties": False,
}
PROMPTS = ["import os\n", "def read_config(path):\n", "class Stack:\n", "# settings\n"]


@pytest.fixture(scope="module")
def llm():
    return LLM(progress=False, dtype="float32")


def _so(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 160)
    spec = {k: kw.pop(k) for k in ("json_schema", "json_object", "regex", "choice", "grammar") if k in kw}
    return SamplingParams(structured_outputs=StructuredOutputsParams(**spec), **kw)


def _replayed(llm: LLM, spec: StructuredOutputsParams, tokens: list[int]) -> bool:
    """xgrammar's own matcher accepts the tokens one by one and ends terminated."""
    grammars = llm.engine.table.grammars
    matcher = xgr.GrammarMatcher(grammars.compiler.compile_grammar(parse(spec)))
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_terminated()


@pytest.mark.slow
def test_sampled_json_schema_outputs_are_schema_valid(llm):
    params = _so(json_schema=SCHEMA, temperature=1.0, seed=3, n=2)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    texts = [c.text for o in outs for c in o.outputs]
    assert len(texts) == 8
    for o in outs:
        for c in o.outputs:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.text), SCHEMA)
            assert _replayed(llm, params.structured_outputs, c.token_ids)
    assert len(set(texts)) > 1  # (n > 1: each sequence its own draws and its own grammar state)


@pytest.mark.slow
def test_json_object_regex_choice_and_ebnf_are_obeyed(llm):
    spec = StructuredOutputsParams(json_object=True)
    obj = llm.generate(PROMPTS[:2], _so(json_object=True, temperature=0, max_tokens=120), use_tqdm=False)
    for o in obj:  # (a free-form object may outrun max_tokens: then it is a prefix xgrammar accepts)
        c = o.outputs[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:
            matcher = xgr.GrammarMatcher(llm.engine.table.grammars.compiler.compile_grammar(parse(spec)))
            assert c.text.startswith("{") and all(matcher.accept_token(t) for t in c.token_ids)
    rx = r"[a-z]{2,5}-\d{3}(\.[a-z]+)?"
    for o in llm.generate(PROMPTS, _so(regex=rx, temperature=1.0, seed=5), use_tqdm=False):
        assert re.fullmatch(rx, o.outputs[0].text), o.outputs[0].text
    choices = ["yes", "no", 'maybe "so"']
    got = {o.outputs[0].text for o in llm.generate(PROMPTS * 2, _so(choice=choices, temperature=1.5, seed=2),
                                                   use_tqdm=False)}
    assert got <= set(choices)
    ebnf = 'root ::= "x=" num (", " num){0,3}\nnum ::= [1-9] [0-9]?'
    for o in llm.generate(PROMPTS, _so(grammar=ebnf, temperature=1.0, seed=9, max_tokens=60), use_tqdm=False):
        assert o.outputs[0].finish_reason == "stop"
        assert re.fullmatch(r"x=[1-9][0-9]?(, [1-9][0-9]?){0,3}", o.outputs[0].text), o.outputs[0].text


@pytest.mark.slow
def test_constrained_and_free_requests_batch_without_changing_each_other(llm):
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, free, use_tqdm=False)]
    constrained = _so(json_schema=SCHEMA, temperature=0)
    alone_c = llm.generate(PROMPTS, constrained, use_tqdm=False)
    mixed = llm.generate(PROMPTS + PROMPTS, [free] * 4 + [constrained] * 4, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:4]] == alone
    assert [o.outputs[0].token_ids for o in mixed[4:]] == [o.outputs[0].token_ids for o in alone_c]


@pytest.mark.slow
def test_greedy_output_is_the_masked_argmax(llm):
    """Each greedy constrained token is the argmax of the model's logits over the tokens the
    grammar allows there (the logits recomputed without the engine's mask, from transformers)."""
    from transformers import AutoModelForCausalLM

    out = llm.generate(PROMPTS[:1], _so(json_schema=SCHEMA, temperature=0, max_tokens=40), use_tqdm=False)[0]
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(out.prompt_token_ids) - 1:-1]
    grammars = llm.engine.table.grammars
    state = grammars.state(grammars.compile(StructuredOutputsParams(json_schema=SCHEMA)))
    for row, token in zip(logits, out.outputs[0].token_ids, strict=True):
        mask = new_bitmask(1, row.numel())
        state.fill(mask, 0)
        allowed = ((mask[0][:, None] >> torch.arange(32)) & 1).bool().flatten()[:row.numel()]
        assert int(row.masked_fill(~allowed, float("-inf")).argmax()) == token
        assert state.accept(token)


@pytest.mark.slow
def test_prefix_cache_hits_keep_outputs_valid_and_equal():
    llm = LLM(progress=False, dtype="float32", plugins=["prefix-cache"], block_size=4)
    params = _so(json_schema=SCHEMA, temperature=0)
    first = llm.generate(PROMPTS, params, use_tqdm=False)
    again = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    assert all(o.num_cached_tokens > 0 for o in again if len(o.prompt_token_ids) > 4)
    for o in again:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    llm.engine.kv.pool.check_all_free()


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_drafts_are_checked_against_the_grammar(llm, drafter):
    """Greedy constrained outputs with a drafter (whose drafts know no grammar) equal those without;
    sampled ones stay schema-valid; drafts were verified and some rejected."""
    greedy = _so(json_schema=SCHEMA, temperature=0)
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    spec = LLM(progress=False, dtype="float32", plugins=[drafter])
    assert [o.outputs[0].token_ids for o in spec.generate(PROMPTS, greedy, use_tqdm=False)] == reference
    sampled = spec.generate(PROMPTS * 2, _so(json_schema=SCHEMA, temperature=1.0, seed=4), use_tqdm=False)
    for o in sampled:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    m = spec.get_metrics()
    assert m["deepinfer:spec_decode_num_verified_tokens"] > m["deepinfer:spec_decode_num_accepted_tokens"] > 0


@pytest.mark.slow
def test_overlapped_engine_takes_constrained_steps_at_once(llm):
    """With overlap on, a step with a constrained request is collected before the next is planned
    (its mask needs the token): the outputs equal the non-overlapped engine's."""
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    params = [free, _so(regex=r"[a-z]+ = \d+", temperature=0, max_tokens=30), free,
              _so(json_schema=SCHEMA, temperature=0)]
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    llm.engine.overlap = True
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.engine.overlap = False
    assert got == reference


@pytest.mark.parametrize("spec,words", [
    (StructuredOutputsParams(regex="(a"), "regular expression"),
    (StructuredOutputsParams(grammar="root ::= undefined_rule"), "undefined_rule"),
    (StructuredOutputsParams(json_schema={"type": "nonsense"}), "nonsense"),
    (StructuredOutputsParams(json_schema="{not json"), "JSON schema"),
])
def test_a_constraint_that_cannot_compile_names_the_problem(llm, spec, words):
    with pytest.raises(GrammarError, match=re.escape(words)):
        parse(spec)
    with pytest.raises(ValueError, match=re.escape(words)):
        llm.generate(PROMPTS[:1], SamplingParams(structured_outputs=spec), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_exactly_one_constraint_per_request():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()


def test_grammar_drafts_rows_roll_back_and_block_after_a_forbidden_draft():
    tok = Tokenizer(DEMO_MODEL)
    grammars = Grammars(tok, tok.vocab_size, [2])
    state = grammars.state(grammars.compile(StructuredOutputsParams(choice=["yes", "no"])))
    yes, bad = tok.encode("yes"), tok.encode("import")
    assert len(yes) == 1
    mask = new_bitmask(3, tok.vocab_size)
    state.fill_drafts(mask, 0, [yes[0], bad[0]])
    bit = lambda row, t: bool((int(mask[row, t // 32]) >> (t % 32)) & 1)
    assert bit(0, yes[0]) and not bit(0, bad[0])  # the first place: the grammar's start
    assert bit(1, 2) and not bit(1, bad[0])        # after "yes": only the stop token
    assert int((mask[2] == -1).all())              # past the forbidden draft: nothing read
    assert state.accept(yes[0])                     # rolled back to the start


@pytest.mark.parametrize("rows", [BATCH_FILL_ROWS - 1, 12])
def test_rows_filled_together_are_each_states_own_mask(rows):
    """``fill_rows`` (xgrammar's threads from BATCH_FILL_ROWS rows) against each state's ``fill``,
    over states at different places in different grammars, a terminated one among them."""
    tok = Tokenizer(DEMO_MODEL)
    grammars = Grammars(tok, tok.vocab_size, [2])
    specs = [StructuredOutputsParams(json_schema=SCHEMA), StructuredOutputsParams(choice=["yes", "no"]),
             StructuredOutputsParams(regex=r"[a-z]{2,5}[0-9]+")]
    texts = ['{"name": "Rex", "kind": "d', "", "ab", '{"na', "yes", "abc12"]  # (text i fits spec i % 3)
    states = []
    for i in range(rows):
        state = grammars.state(grammars.compile(specs[i % 3]))
        assert all(state.accept(t) for t in tok.encode(texts[i % 6], add_special_tokens=False))
        states.append(state)
    assert states[1].accept(tok.encode("no")[0]) and states[1].accept(2) and states[1].done
    one_by_one, together = new_bitmask(rows, tok.vocab_size), new_bitmask(rows, tok.vocab_size)
    for i, state in enumerate(states):
        state.fill(one_by_one, i)
    fill_rows(together, states)
    assert torch.equal(together, one_by_one)
    assert bool((together[1] == -1).all()) and len({tuple(r.tolist()) for r in together}) >= min(rows, 4)


@pytest.mark.parametrize("bound", [{"maxLength": 12}, {"minLength": 1}, {}])
def test_a_strings_characters_are_what_json_allows_whatever_its_length_bounds(llm, bound):
    """Inside a string of a schema, a token that decodes to a control character (here the demo
    tokenizer's byte 0x03 and a tab) is refused and an escape is taken, with or without minLength or
    maxLength (xgrammar's own rule for bounded strings lets raw control characters through)."""
    tok = llm.get_tokenizer()
    spec = StructuredOutputsParams(json_schema={"type": "object", "properties": {"a": {"type": "string", **bound}},
                                                "required": ["a"], "additionalProperties": False})
    table = llm.engine.table
    compiled = Grammars(table.tokenizer, table.vocab_size, table.eos_token_ids).compiler.compile_grammar(parse(spec))

    def accepts(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False))

    assert accepts('{"a": "ab') and accepts('{"a": "a\\u0041b\\n')
    for control in ("\x03", "\t"):
        assert tok.decode(tok.encode(control, add_special_tokens=False)) == control
        assert not accepts('{"a": "a' + control)
    assert json.loads(tok.decode(tok.encode('{"a": "a\\u0041"}', add_special_tokens=False))) == {"a": "aA"}
