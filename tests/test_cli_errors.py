"""How the command line reports errors: input mistakes in one line with exit 2, errors raised in a
plugin's code naming the plugin and its distribution with exit 1, tracebacks only with --debug or
DEEPINFER_DEBUG=1, and serve exiting as generate does (docs/cli.md)."""
from __future__ import annotations

import pytest

from deepinfer.cli_errors import report
from tests.thirdparty import run_cli, run_code

BUGGY = ("deepinfer: error in plugin 'example-buggy' (deepinfer-example-plugins 0.0.1): ValueError: "
         "bug in my drafter")


def _generate_with_buggy_drafter(site, tiny_llama, *extra: str, **env: str):
    path, _ = tiny_llama
    return run_cli(site, "generate", str(path), "--plugins", "example-buggy", "--prompt", "x", "--max-tokens", "4",
                   *extra, **env)


@pytest.mark.slow
def test_an_error_raised_in_a_plugin_names_it_and_its_distribution(thirdparty_site, tiny_llama):
    res = _generate_with_buggy_drafter(thirdparty_site, tiny_llama)
    assert res.returncode == 1
    assert res.stderr.strip() == BUGGY + " (run with --debug or DEEPINFER_DEBUG=1 for the traceback)"


@pytest.mark.slow
@pytest.mark.parametrize("flag, env", [(("--debug",), {}), ((), {"DEEPINFER_DEBUG": "1"})])
def test_debug_prints_the_traceback_into_the_plugin(thirdparty_site, tiny_llama, flag, env):
    res = _generate_with_buggy_drafter(thirdparty_site, tiny_llama, *flag, **env)
    assert res.returncode == 1
    assert "Traceback (most recent call last)" in res.stderr
    assert "deepinfer_example_plugins/buggy.py" in res.stderr and 'raise ValueError("bug in my drafter")' in res.stderr
    assert res.stderr.strip().endswith(BUGGY)


def test_bad_input_is_one_line_with_exit_2(tmp_path, capsys):
    from deepinfer.cli import main

    assert main(["generate", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert capsys.readouterr().err == f"deepinfer: error: model directory {str(tmp_path / 'missing')!r} does not exist\n"


def test_an_unexpected_error_in_deepinfer_is_not_called_bad_input(capsys, monkeypatch):
    monkeypatch.delenv("DEEPINFER_DEBUG", raising=False)
    try:
        {}["x"]
    except KeyError as e:
        code = report(e)
    assert code == 1
    assert capsys.readouterr().err == ("deepinfer: internal error: KeyError: 'x' (run with --debug or "
                                       "DEEPINFER_DEBUG=1 for the traceback)\n")


@pytest.mark.parametrize("args, message", [
    (["--plugins", "nope"], "unknown plugin 'nope'"),
    (["--plugins", "prefix-cache,no-cache"], "contradict each other"),
    (["MISSING"], "does not exist"),
])
def test_serve_and_generate_exit_alike_on_the_same_mistake(tmp_path, capsys, monkeypatch, args, message):
    """serve checks config, plugins and model in its own process before starting the engine's."""
    import deepinfer.serve.server
    from deepinfer.cli import main

    def start(*_args):  # (a server that got this far would start an engine and listen)
        raise AssertionError("serve went on to start the engine despite a mistake in its input")

    monkeypatch.setattr(deepinfer.serve.server, "run_serve", start)

    args = [str(tmp_path / "missing") if a == "MISSING" else a for a in args]
    codes = {}
    for command in (["serve", "--port", "0"], ["generate", "--prompt", "x"]):
        codes[command[0]] = main([command[0], *args, *command[1:]])
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert codes == {"serve": 2, "generate": 2}


def test_a_builtin_plugins_refusal_of_its_input_is_bad_input_naming_it(tiny_llama, capsys):
    from deepinfer.cli import main

    path, _ = tiny_llama  # (no sliding-window layers: swa-replay has nothing to do)
    assert main(["generate", str(path), "--plugins", "prefix-cache,swa-replay", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deepinfer: error: plugin 'swa-replay' (deepinfer 0.1.0): cache policy 'swa-replay' has "
                          "nothing to do") and err.count("\n") == 1


@pytest.mark.slow
def test_the_server_engine_names_the_plugin_a_step_failed_in(thirdparty_site, tiny_llama):
    """The server's engine process (EngineCore) fails the batch of a step that raised in a plugin's
    code with a 500 that names the plugin and its distribution, as the command line does."""
    path, _ = tiny_llama
    code = f"""
from types import SimpleNamespace
from deepinfer import LLM, SamplingParams
from deepinfer.serve.engine_core import EngineCore
llm = LLM({str(path)!r}, plugins=["example-buggy"], progress=False)
sent = []
core = EngineCore(llm.engine, SimpleNamespace(send=sent.append))
core.handle([("add", "r", [1, 2, 3], SamplingParams(max_tokens=4), None)])
for _ in range(3):  # (the prompt's step, then a decode: the drafter proposes and raises)
    core.step()
print(sent[-1])
"""
    res = run_code(thirdparty_site, code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == str(("failed", [(
        "r", 500, ("internal error in the engine step: in plugin 'example-buggy' (deepinfer-example-plugins 0.0.1): "
                  "ValueError: bug in my drafter"))]))
