"""`deepinfer bench structured` on the demo model (CPU, tiny sizes): both modes' rows, the ratio
computed from them, and every constrained output valid against its schema (jsonschema the oracle)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from deepinfer.bench.models import build_random_model
from deepinfer.bench.structured import BUILTIN_SCHEMA, give_tokenizer
from deepinfer.cli import main
from deepinfer.core import grammar
from deepinfer.core.sampling_params import StructuredOutputsParams

SMALL = {"type": "object",
         "properties": {"kind": {"type": "string", "enum": ["order", "refund"]},
                        "qty": {"type": "integer", "minimum": 0, "maximum": 9},
                        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "enum": ["a", "b"]}}},
         "required": ["kind", "qty", "tags"], "additionalProperties": False}


def test_builtin_schema_is_valid_and_compiles():
    jsonschema.Draft202012Validator.check_schema(BUILTIN_SCHEMA)
    assert grammar.parse(StructuredOutputsParams(json_schema=BUILTIN_SCHEMA)) is not None


def test_a_random_model_gets_the_demo_tokenizer(tmp_path):
    path = build_random_model("llama-tiny", out=str(tmp_path / "m"))
    give_tokenizer(path)
    assert (Path(path) / "tokenizer.json").is_file()


@pytest.mark.slow
def test_rows_ratio_and_valid_outputs(tmp_path, capsys):
    schema_file, out = tmp_path / "schema.json", tmp_path / "out.json"
    schema_file.write_text(json.dumps(SMALL))
    rc = main(["bench", "structured", "--device", "cpu", "--json-schema", str(schema_file), "--num-requests", "3",
               "--concurrency", "3", "--input-len", "8", "--max-tokens", "48", "--repeats", "1",
               "--json", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln.split() for ln in lines if ln.split()[:1] in (["json-schema"], ["unconstrained"])}
    assert set(rows) == {"json-schema", "unconstrained"}
    # matched lengths: the unconstrained run generates what the constrained one did, request by request
    assert rows["json-schema"][2] == rows["unconstrained"][2]
    ratio = next(ln for ln in lines if ln.startswith("ratio json-schema / unconstrained"))
    assert float(ratio.split()[-1]) == pytest.approx(float(rows["json-schema"][4]) / float(rows["unconstrained"][4]),
                                                     rel=0.01)
    result = json.loads(out.read_text())["results"][-1]
    assert len(result["outputs"]) == 3 and result["cut_at_max_tokens"] == 0
    for text in result["outputs"]:
        jsonschema.validate(json.loads(text), SMALL)
    assert "constrained outputs: 3 of 3 parse as JSON, 3 valid against the schema; 0 cut" in "\n".join(lines)


def test_a_schema_that_is_not_a_file_is_refused_before_any_work(tmp_path, capsys):
    assert main(["bench", "structured", "--json-schema", str(tmp_path / "missing.json")]) == 2
    assert "is neither 'builtin' nor a file" in capsys.readouterr().err
