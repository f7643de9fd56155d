"""The worked examples of docs/writing-a-plugin.md, one a slot, as the installed fixture package,
and a model-based drafter written on the public API alone (``SecondModel``): each runs, and the
oracle says it did its job (the same tokens as the built-in it stands in for, or counts of what it
saw)."""
from __future__ import annotations

import json

import pytest

from tests.thirdparty import run_code

pytestmark = pytest.mark.slow

CODE = """
import json
from deepinfer import LLM, SamplingParams
prompts = [{{"prompt_token_ids": p}} for p in ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20] * 11)]
greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)

def run(**kw):
    llm = LLM({path!r}, device="cpu", block_size=4, progress=False, **kw)
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.get_metrics()

ref, _ = run()
found = {{}}
for name, kw in {{"naive": dict(plugins=["example-naive"]), "serial": dict(plugins=["example-serial"]),
                 "repeat": dict(plugins=["example-repeat"], plugin_options={{"example-repeat": {{"k": 2}}}}),
                 "finished": dict(plugins=["example-finished"]),
                 "draft": dict(plugins=["example-draft"], plugin_options={{"example-draft": {{"k": 2}}}})}}.items():
    tokens, m = run(**kw)
    found[name] = {{"same": tokens == ref, "metrics": m}}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def found(thirdparty_site, tiny_llama):
    path, _ = tiny_llama
    res = run_code(thirdparty_site, CODE.format(path=str(path)))
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_attention_example_gives_the_torch_backends_tokens(found):
    assert found["naive"]["same"]


def test_the_scheduler_example_gives_fcfs_tokens(found):
    assert found["serial"]["same"]
    assert found["serial"]["metrics"]["deepinfer:request_success"] == 3


def test_the_drafter_example_drafts_and_changes_no_token(found):
    m = found["repeat"]["metrics"]
    assert found["repeat"]["same"]
    assert m["deepinfer:spec_decode_num_drafts"] > 0
    assert m["deepinfer:spec_decode_num_draft_tokens"] == 2 * m["deepinfer:spec_decode_num_drafts"]


def test_a_model_based_drafter_on_the_public_api_drafts_and_changes_no_token(found):
    """Its draft is the target itself, so its greedy drafts are accepted."""
    m = found["draft"]["metrics"]
    assert found["draft"]["same"]
    assert m["deepinfer:spec_decode_num_draft_tokens"] == 2 * m["deepinfer:spec_decode_num_drafts"] > 0
    assert m["deepinfer:spec_decode_num_accepted_tokens"] > 0


def test_the_hook_example_counts_the_tokens_of_finished_requests(found):
    assert found["finished"]["same"]
    assert found["finished"]["metrics"]["deepinfer:example_finished_tokens"] == 3 * 9
