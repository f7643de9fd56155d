"""Hook plugins are checked against the specs: a hook name no spec has, or an argument its spec
does not pass, is reported by `plugins list` and refused at selection, with the spec's signature."""
from __future__ import annotations

import json
import types

import pytest

from deepinfer.plugins import PluginError, hookimpl
from deepinfer.plugins.hookcheck import hook_problems, spec_signature
from tests.thirdparty import run_cli, run_code


def _module(**fns) -> types.ModuleType:
    mod = types.ModuleType("a_hook_plugin")
    for name, fn in fns.items():
        fn.__name__ = name
        setattr(mod, name, hookimpl(fn))
    return mod


def test_hooks_matching_their_specs_pass_taking_any_subset_of_the_arguments():
    ok = _module(deepinfer_step_end=lambda num_tokens: None, deepinfer_request_finished=lambda: None,
                 deepinfer_request_added=lambda request_id, num_prompt_tokens: None)
    assert hook_problems(ok) == []


def test_a_misspelled_hook_name_is_reported_with_the_closest_spec():
    problems = hook_problems(_module(deepinfer_step_ended=lambda engine: None))
    assert len(problems) == 1
    assert problems[0].startswith("deepinfer_step_ended is no deepinfer hook (did you mean deepinfer_step_end?)")


def test_an_argument_the_spec_does_not_pass_is_reported_with_the_spec_signature():
    problems = hook_problems(_module(deepinfer_request_finished=lambda request: None))
    assert problems == [("deepinfer_request_finished takes 'request', which the spec "
                         "deepinfer_request_finished(request_id, output) does not pass")]
    assert spec_signature("deepinfer_step_end") == "deepinfer_step_end(engine, num_tokens)"


def test_methods_of_a_hook_class_are_checked_without_their_self():
    class Good:
        @hookimpl
        def deepinfer_step_end(self, num_tokens):
            pass

    class Bad:
        @hookimpl
        def deepinfer_step_end(self, tokens):
            pass

    assert hook_problems(Good) == [] and hook_problems(Good()) == []
    assert hook_problems(Bad) == hook_problems(Bad()) == [
        ("deepinfer_step_end takes 'tokens', which the spec deepinfer_step_end(engine, num_tokens) does not pass")]


@pytest.mark.slow
def test_plugins_list_reports_hook_plugins_that_cannot_run(thirdparty_site):
    res = run_cli(thirdparty_site, "plugins", "list", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["example-observer"]["status"] == "ok"
    assert rows["example-misspelled"]["status"].startswith(
        "hooks do not match the specs: deepinfer_step_ended is no deepinfer hook (did you mean deepinfer_step_end?)")
    assert rows["example-wrong-argument"]["status"] == (
        "hooks do not match the specs: deepinfer_request_finished takes 'request', which the spec "
        "deepinfer_request_finished(request_id, output) does not pass")


@pytest.mark.slow
@pytest.mark.parametrize("name, says", [
    ("example-misspelled", "deepinfer_step_ended is no deepinfer hook"),
    ("example-wrong-argument", "deepinfer_request_finished takes 'request'"),
])
def test_selecting_a_hook_plugin_that_cannot_run_is_refused_in_one_line(thirdparty_site, name, says):
    code = f"""
from deepinfer.core.config import EngineConfig
from deepinfer.plugins.selection import select
try:
    select(EngineConfig(plugins=[{name!r}]))
except Exception as e:
    print(type(e).__name__, e)
"""
    res = run_code(thirdparty_site, code)
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith(f"PluginError hook plugin {name!r} (from deepinfer-example-plugins 0.0.1) cannot run: ")
    assert says in out and "\n" not in out


def test_plugin_error_is_what_selection_raises():
    assert issubclass(PluginError, ValueError)  # (so the command line reports it as input: exit 2)


def test_a_slot_plugins_hooks_are_checked_too(monkeypatch):
    """Slot plugins may implement hooks (the engine registers them); theirs are checked alike."""
    from deepinfer.core.config import EngineConfig
    from deepinfer.plugins.selection import select
    from deepinfer_builtin.drafters.ngram import NgramDrafter

    def deepinfer_step_ended(self, engine):
        pass

    monkeypatch.setattr(NgramDrafter, "deepinfer_step_ended", hookimpl(deepinfer_step_ended), raising=False)
    with pytest.raises(PluginError, match=r"^plugin 'ngram' \(from deepinfer 0.1.0\) cannot run: deepinfer_step_ended "
                                          r"is no deepinfer hook \(did you mean deepinfer_step_end\?\)"):
        select(EngineConfig(plugins=["ngram"]))
