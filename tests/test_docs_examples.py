"""The README's and docs/writing-a-plugin.md's examples, run as written on the demo model: every
Python block, every shell command (the README's set-up commands excepted: CI runs the test one
itself, and the serve one does not return). docs/writing-a-plugin.md's file blocks are the fixture
package's files, character for character, and its commands run with that package installed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.thirdparty import FIXTURE, env_with

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks(doc: str, skip_section: str | None = None) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of ``doc``, leaving out the section ``skip_section``."""
    text = (ROOT / doc).read_text()
    if skip_section:
        start = text.index(f"## {skip_section}")
        end = text.index("\n## ", start + 1)
        text = text[:start] + text[end:]
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def commands(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, f"{args[-1]}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def _examples(doc: str, skip: str | None = None) -> list[tuple[str, str]]:
    out = []
    for lang, text in blocks(doc, skip):
        if lang == "python" and not text.startswith("# deepinfer_example_plugins/"):
            out.append(("python", text))
        elif lang == "bash":
            out += [("bash", c) for c in commands(text)]
    return out


README = _examples("README.md", "Set up on a fresh machine")
PLUGIN_DOC = _examples("docs/writing-a-plugin.md")


def test_the_readme_has_examples_and_its_set_up_is_the_two_commands():
    setup = [t for lang, t in blocks("README.md") if lang == "bash"][:2]
    assert [commands(t) for t in setup] == [
        ['python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e . && .venv/bin/deepinfer serve'],
        [('python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[test]" && .venv/bin/python -m '
          'pytest -q -p no:cacheprovider -n auto --dist worksteal')]]
    assert {lang for lang, _ in README} == {"python", "bash"}
    assert not any("MODEL" in text or "path/to" in text.split("#")[0] for _, text in README)


@pytest.mark.slow
@pytest.mark.parametrize("lang, text", README, ids=[t[:50] for _, t in README])
def test_readme_example_runs_as_written(lang, text, tmp_path):
    env = env_with(tmp_path)  # (nothing installed there: the package as a user has it)
    _run([sys.executable, "-c", text] if lang == "python" else ["bash", "-c", text], tmp_path, env)


def test_every_file_block_of_writing_a_plugin_is_the_fixture_file():
    files = [t for lang, t in blocks("docs/writing-a-plugin.md") if t.startswith("# deepinfer_example_plugins/")]
    assert len(files) == 6  # one a slot, and a hook plugin
    for text in files:
        name, body = text.split("\n", 1)
        assert body == (FIXTURE / name.removeprefix("# ")).read_text(), name


def test_the_entry_points_of_writing_a_plugin_are_the_fixture_packages():
    (toml,) = [t for lang, t in blocks("docs/writing-a-plugin.md") if lang == "toml"]
    fixture = set((FIXTURE / "pyproject.toml").read_text().splitlines())
    assert [line for line in commands(toml) if line not in fixture] == []


@pytest.mark.slow
@pytest.mark.parametrize("lang, text", PLUGIN_DOC, ids=[t[:60] for _, t in PLUGIN_DOC])
def test_writing_a_plugin_example_runs_as_written(lang, text, thirdparty_site, tmp_path):
    res = _run([sys.executable, "-c", text] if lang == "python" else ["bash", "-c", text], tmp_path,
               env_with(thirdparty_site))
    if "--metrics" in text:  # the plugin's own metric is there to see
        name = re.search(r"--plugins (example-\w+)", text).group(1)
        metric = {"example-counter": "deepinfer:example_freed_blocks", "example-repeat": "spec_decode_num_drafts",
                  "example-finished": "deepinfer:example_finished_tokens"}[name]
        assert metric in res.stdout
