"""`deepinfer bench structured`: output tok/s with a JSON schema on every request against none (issue 74).

A bench of its own, run in process (``LLM.generate`` with ``max_num_seqs`` = ``--concurrency``), not
an option of `bench serve`: the acceptance is about what masking by a grammar costs the engine at 64
concurrent sequences, which HTTP would only blur (it adds the same to both modes), and the
in-process engine runs ``--random-model`` shapes, the size of a real deployment, where `bench serve`
runs a model directory only. A random model gets the demo model's tokenizer, without which a grammar
cannot know what a token spells (ids past that tokenizer's vocabulary are never allowed by a grammar).

Matched lengths: a grammar ends its sequence when the JSON closes, and structured outputs refuse
``ignore_eos``, so the constrained run goes first and the unconstrained run then generates, with
``ignore_eos``, exactly as many tokens for each request as the constrained run did for it. Both modes
then do the same work and their output tok/s compare the cost of the grammar alone. The builtin
schema bounds its strings, numbers and arrays so that the JSON closes within ``--max-tokens``: an
output cut there is counted and reported (it cannot parse), never dropped.
"""
from __future__ import annotations

import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from deepinfer.bench.output import add_json_arg, progress, write_json

#: an order as an API might return it: nested objects, enums, arrays, required fields, bounded sizes
BUILTIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 0, "maximum": 999999},
        "status": {"type": "string", "enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                           "tier": {"type": "string", "enum": ["free", "pro", "enterprise"]},
                           "verified": {"type": "boolean"}},
            "required": ["name", "tier", "verified"], "additionalProperties": False},
        "items": {
            "type": "array", "minItems": 1, "maxItems": 4,
            "items": {"type": "object",
                      "properties": {"sku": {"type": "string", "minLength": 1, "maxLength": 8},
                                     "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                     "price_cents": {"type": "integer", "minimum": 0, "maximum": 99999}},
                      "required": ["sku", "quantity", "price_cents"], "additionalProperties": False}},
        "shipping": {"type": "string", "enum": ["standard", "express", "pickup"]},
        "notes": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 12}},
    },
    "required": ["order_id", "status", "customer", "items", "shipping"],
    "additionalProperties": False,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def add_structured_parser(bsub, add_engine_args, engine_overrides) -> None:
    b = bsub.add_parser("structured", help="output tok/s with a JSON schema on every request over none",
                        description=__doc__)
    add_engine_args(b)
    b.add_argument("--random-model", default=None,
                   help="build a random model of this shape instead (llama-1b, ...; given the demo model's tokenizer)")
    b.add_argument("--json-schema", default="builtin", metavar="{builtin,PATH}",
                   help="the schema of every constrained request: 'builtin' (an order: nested objects, enums, "
                        "arrays, required fields) or a JSON file")
    b.add_argument("--concurrency", type=int, default=64, help="sequences at once (the engine's max_num_seqs)")
    b.add_argument("--num-requests", type=int, default=256)
    b.add_argument("--input-len", type=int, default=256, help="random prompt tokens per request")
    b.add_argument("--max-tokens", type=int, default=1024,
                   help="cap of a constrained output (the unconstrained twin generates as many tokens as it did)")
    b.add_argument("--repeats", type=int, default=3, help="timed runs of each mode (the median is printed)")
    add_json_arg(b)
    b.set_defaults(func=lambda a, _ov=engine_overrides: run_structured(a, _ov(a)))


def load_schema(spec: str) -> dict[str, Any]:
    if spec == "builtin":
        return BUILTIN_SCHEMA
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--json-schema {spec!r} is neither 'builtin' nor a file; give a JSON schema file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--json-schema {spec}: not JSON ({e}); give a JSON schema file") from None


def give_tokenizer(model_dir: str) -> None:
    """Copy the demo model's tokenizer into a (random) model directory that has none."""
    from deepinfer.builder import demo_model_path

    if (Path(model_dir) / "tokenizer.json").is_file():
        return
    for name in TOKENIZER_FILES:
        src = Path(demo_model_path()) / name
        if src.is_file():
            shutil.copy(src, Path(model_dir) / name)


def _timed(llm, prompts: list[dict], params: list) -> tuple[float, list]:
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t, [o.outputs[0] for o in outs]


def check_outputs(texts: list[str], schema: dict[str, Any]) -> tuple[int, int | None]:
    """(outputs that parse as JSON, of those the ones valid against ``schema``; None: jsonschema is
    not installed)."""
    parsed = []
    for t in texts:
        try:
            parsed.append(json.loads(t))
        except json.JSONDecodeError:
            pass
    try:
        import jsonschema
    except ImportError:
        return len(parsed), None
    validator = jsonschema.Draft202012Validator(schema)
    return len(parsed), sum(validator.is_valid(p) for p in parsed)


def run_structured(args, overrides: dict) -> int:
    from deepinfer.bench.models import bench_model
    from deepinfer.core.sampling_params import SamplingParams, StructuredOutputsParams
    from deepinfer.llm import LLM

    schema = load_schema(args.json_schema)
    model, overrides = bench_model(args, overrides, "bfloat16")
    if model is not None and args.random_model:
        give_tokenizer(model)
    overrides["max_num_seqs"] = args.concurrency
    llm = LLM(model, config_file=args.config_file, progress=False, **overrides)
    vocab = llm.engine.ctx.model_config["vocab_size"]
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(16, vocab) for _ in range(args.input_len)]}
               for _ in range(args.num_requests)]
    constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                 structured_outputs=StructuredOutputsParams(json_schema=schema))
    # warm-up: compiles the grammar (kept for later requests) and every kernel variant
    llm.generate(prompts[:args.concurrency], constrained.model_copy(update={"max_tokens": 8}), use_tqdm=False)
    runs: dict[str, list[float]] = {"json-schema": [], "unconstrained": []}
    for i in range(args.repeats):
        secs, outs = _timed(llm, prompts, [constrained] * len(prompts))
        runs["json-schema"].append(secs)
        if i == 0:
            lens = [len(o.token_ids) for o in outs]
            plain = [SamplingParams(temperature=0, max_tokens=max(n, 1), ignore_eos=True) for n in lens]
            texts, cut = [o.text for o in outs], sum(o.finish_reason == "length" for o in outs)
        secs, plain_outs = _timed(llm, prompts, plain)
        runs["unconstrained"].append(secs)
        progress(f"structured repeat {i + 1}: json-schema {runs['json-schema'][-1]:.3f} s, "
                 f"unconstrained {secs:.3f} s")
    plain_lens = [len(o.token_ids) for o in plain_outs]
    rows = [_row("json-schema", runs["json-schema"], lens), _row("unconstrained", runs["unconstrained"], plain_lens)]
    ratio = rows[0]["output_tok_s"] / rows[1]["output_tok_s"]
    parsed, valid = check_outputs(texts, schema)
    _print(args, rows, ratio, parsed, valid, cut)
    write_json(args, [*rows, {"name": "ratio", "output_tok_s_ratio": ratio, "parsed": parsed, "valid": valid,
                              "cut_at_max_tokens": cut, "outputs": texts}])
    return 0


def _row(name: str, seconds: list[float], lens: list[int]) -> dict[str, Any]:
    median = statistics.median(seconds)
    tokens = sum(lens)
    return {"name": name, "seconds": seconds, "median_s": median, "output_tokens": tokens,
            "mean_output_len": tokens / len(lens), "output_tok_s": tokens / median}


def _print(args, rows: list[dict], ratio: float, parsed: int, valid: int | None, cut: int) -> None:
    n = args.num_requests
    print(f"deepinfer bench structured: {n} requests of {args.input_len} prompt tokens, at most {args.max_tokens} "
          f"new, concurrency {args.concurrency}, schema {args.json_schema}")
    print(f"{'mode':<15}{'median s':>10}{'output tokens':>15}{'mean output len':>17}{'output tok/s':>14}")
    for r in rows:
        print(f"{r['name']:<15}{r['median_s']:>10.3f}{r['output_tokens']:>15}{r['mean_output_len']:>17.1f}"
              f"{r['output_tok_s']:>14.1f}")
    print(f"ratio json-schema / unconstrained (output tok/s): {ratio:.3f}")
    valid_text = "jsonschema not installed" if valid is None else f"{valid} valid against the schema"
    print(f"constrained outputs: {parsed} of {n} parse as JSON, {valid_text}; {cut} cut at --max-tokens")
