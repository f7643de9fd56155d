"""Plugins that contradict each other are refused, as two plugins for a slot that takes one are."""
from __future__ import annotations

import pytest

from deepinfer.core.config import EngineConfig
from deepinfer.plugins import PluginError
from deepinfer.plugins.selection import select


@pytest.mark.parametrize("plugins", [["prefix-cache", "no-cache"], ["no-cache", "prefix-cache"],
                                     ["prefix-cache", "swa-replay", "no-cache"]])
def test_no_cache_with_a_reusing_policy_is_refused(plugins):
    with pytest.raises(PluginError, match=r"plugins 'no-cache' and '(prefix-cache|swa-replay)' contradict each "
                                          r"other \('no-cache' excludes '\1'\); keep one of them"):
        select(EngineConfig(plugins=plugins))


def test_a_declared_exclusion_is_refused_whichever_side_declares_it(monkeypatch):
    from deepinfer_builtin.drafters.ngram import NgramDrafter

    monkeypatch.setattr(NgramDrafter, "excludes", ("prefix-cache",), raising=False)
    with pytest.raises(PluginError, match="plugins 'ngram' and 'prefix-cache' contradict each other"):
        select(EngineConfig(plugins=["prefix-cache", "ngram"]))


@pytest.mark.parametrize("plugins", [["no-cache"], ["prefix-cache"], ["prefix-cache", "swa-replay"], []])
def test_policies_that_agree_are_selected(plugins):
    sel = select(EngineConfig(plugins=plugins))
    assert [i.name for i in sel.all("cache_policy")] == (plugins or ["no-cache"])


def test_the_command_line_refuses_them_as_bad_input(tiny_llama, capsys):
    from deepinfer.cli import main

    path, _ = tiny_llama
    rc = main(["generate", str(path), "--plugins", "prefix-cache,no-cache", "--prompt", "x"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == ("deepinfer: error: plugins 'no-cache' and 'prefix-cache' contradict "
                                               "each other ('no-cache' excludes 'prefix-cache'); keep one of them")
