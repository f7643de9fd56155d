"""Bad input gets a clear error naming what was wrong and what is valid; nothing is left running."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file, save_file

from deepinfer import LLM, SamplingParams
from deepinfer.core.loader import WeightsError
from deepinfer.core.model_config import ModelConfigError
from deepinfer.core.model_registry import UnsupportedArchitectureError
from deepinfer.core.request_table import PromptTooLongError
from deepinfer.plugins import PluginError


def test_unknown_plugin_lists_the_known_ones(tiny_llama):
    path, _ = tiny_llama
    with pytest.raises(PluginError, match=r"unknown plugin 'nope'; known: .*cpu.*fcfs.*no-cache.*torch"):
        LLM(str(path), plugins=["nope"], progress=False)


def test_duplicate_plugin_name_is_rejected_by_config(tiny_llama):
    path, _ = tiny_llama
    with pytest.raises(ValidationError, match="listed twice"):
        LLM(str(path), plugins=["torch", "torch"], progress=False)


def test_options_for_unselected_plugin_and_bad_option(tiny_llama):
    path, _ = tiny_llama
    with pytest.raises(PluginError, match=r"options given for \['prefix-nope'\]"):
        LLM(str(path), plugin_options={"prefix-nope": {"x": 1}}, progress=False)
    with pytest.raises(PluginError, match=r"options of plugin 'fcfs' are invalid"):
        LLM(str(path), plugin_options={"fcfs": {"long_prefill_token_threshold": -1}}, progress=False)


def test_model_directory_without_config_json(tmp_path):
    with pytest.raises(ModelConfigError, match="has no config.json"):
        LLM(str(tmp_path), progress=False)
    with pytest.raises(ModelConfigError, match="does not exist"):
        LLM(str(tmp_path / "missing"), progress=False)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelConfigError, match="is a file, not a directory"):
        LLM(str(tmp_path / "weights.bin"), progress=False)


def test_unsupported_architecture_lists_supported(tiny_llama, tmp_path):
    path, _ = tiny_llama
    shutil.copytree(path, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError,
                       match=r"'GPT2LMHeadModel' is not supported; supported: DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                             r"LlamaForCausalLM, Mistral"):
        LLM(str(tmp_path / "m"), progress=False)


def test_missing_and_mismatched_weights(tiny_llama, tmp_path):
    path, _ = tiny_llama
    weights = load_file(str(path / "model.safetensors"))
    for name, mutate, pattern in [
        ("missing", lambda w: w.pop("model.layers.1.mlp.up_proj.weight"), r"lacks tensors for: .*layers.1.mlp"),
        ("shape", lambda w: w.__setitem__("model.norm.weight", w["model.norm.weight"][:10]),
         r"'model.norm.weight' has shape \(10,\), the model expects \(64,\)"),
        ("extra", lambda w: w.__setitem__("model.extra.weight", w["model.norm.weight"].clone()),
         r"does not use: \['model.extra.weight'\]"),
    ]:
        d = tmp_path / name
        shutil.copytree(path, d)
        w = dict(weights)
        mutate(w)
        save_file(w, str(d / "model.safetensors"))
        with pytest.raises(WeightsError, match=pattern):
            LLM(str(d), progress=False)
    (tmp_path / "none").mkdir()
    shutil.copy(path / "config.json", tmp_path / "none" / "config.json")
    with pytest.raises(WeightsError, match=r"has no \*.safetensors"):
        LLM(str(tmp_path / "none"), progress=False)


def test_prompt_longer_than_max_model_len_adds_nothing(tiny_llama):
    path, _ = tiny_llama
    llm = LLM(str(path), max_model_len=32, progress=False)
    ok = {"prompt_token_ids": [5, 6, 7]}
    with pytest.raises(PromptTooLongError, match="the prompt has 40 tokens but max_model_len is 32"):
        llm.generate([ok, {"prompt_token_ids": list(range(40))}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.kv.pool.check_all_free()
    assert llm.generate(ok, SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_generation_stops_at_max_model_len(tiny_llama):
    path, _ = tiny_llama
    llm = LLM(str(path), max_model_len=32, progress=False)
    out = llm.generate({"prompt_token_ids": list(range(5, 25))}, SamplingParams(max_tokens=100, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 12 and out.finish_reason == "length"


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"), ({"stop": [""]}, "stop"), ({"bogus": 1}, "bogus"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
])
def test_invalid_sampling_params_give_pydantic_messages(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        SamplingParams(**kwargs)


def test_bad_prompt_types_and_counts(tiny_llama):
    path, _ = tiny_llama
    llm = LLM(str(path), progress=False)
    with pytest.raises(TypeError, match="a prompt is a string or a dict"):
        llm.generate([123], use_tqdm=False)
    with pytest.raises(ValueError, match="got 2 SamplingParams for 1 prompts"):
        llm.generate({"prompt_token_ids": [1]}, [SamplingParams(), SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 320\)"):
        llm.generate({"prompt_token_ids": [999]}, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_config_file_device_and_dtype_apply_to_llm(tiny_llama, tmp_path):
    """LLM's device and dtype left out take the config file's (they used to override it with auto)."""
    path, _ = tiny_llama
    (tmp_path / "run.yaml").write_text("dtype: float32\ndevice: cpu\n")
    llm = LLM(str(path), config_file=str(tmp_path / "run.yaml"), progress=False)
    assert (llm.config.dtype, llm.config.device) == ("float32", "cpu")
    assert next(llm.engine.runner.model.parameters()).dtype == torch.float32
    (tmp_path / "gpu.yaml").write_text("device: sm90\n")
    with pytest.raises(PluginError, match="sm90"):
        LLM(str(path), config_file=str(tmp_path / "gpu.yaml"), progress=False)


@pytest.mark.parametrize("name, text, kind", [("bad.yaml", "plugins: [a\n", "YAML"), ("bad.json", "{", "JSON"),
                                              ("bad.toml", "a = ", "TOML")])
def test_config_file_that_does_not_parse_is_named(tiny_llama, tmp_path, name, text, kind):
    path, _ = tiny_llama
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"config file '.*{name}' is not valid {kind}"):
        LLM(str(path), config_file=str(tmp_path / name), progress=False)


@pytest.mark.parametrize("options", [[1], "x", {"fcfs": 1}])
def test_plugin_options_of_the_wrong_shape(tiny_llama, options):
    path, _ = tiny_llama
    with pytest.raises(ValueError, match=r"plugin_options must map plugin names to objects of their options"):
        LLM(str(path), plugin_options=options, progress=False)


def test_cli_plugin_options_and_tokenizer_errors(tiny_llama, capsys, tmp_path):
    from deepinfer.cli import main

    path, _ = tiny_llama
    with pytest.raises(SystemExit):
        main(["generate", str(path), "--plugin-options", "{nope", "--prompt", "hi"])
    assert "is not valid JSON" in capsys.readouterr().err
    assert main(["generate", str(path), "--tokenizer", str(tmp_path / "none"), "--prompt", "hi"]) != 0
    err = capsys.readouterr().err
    assert "no tokenizer.json there" in err and str(tmp_path / "none") in err


def test_option_typos_name_the_valid_options(tiny_llama):
    path, _ = tiny_llama
    with pytest.raises(ValueError, match=r"unknown engine option 'max_num_seq'; valid options: .*max_num_seqs"):
        LLM(str(path), max_num_seq=4, progress=False)
    with pytest.raises(PluginError, match=r"plugin 'fcfs' has no option 'bogus'; its options: .*overlap"):
        LLM(str(path), plugin_options={"fcfs": {"bogus": 1}}, progress=False)


def test_generate_refuses_bad_sampling_parameters_before_building_the_engine(capsys, monkeypatch):
    import deepinfer.llm
    from deepinfer.cli import main

    built = []
    monkeypatch.setattr(deepinfer.llm, "build_engine", lambda *a, **k: built.append(1))
    assert main(["generate", "--max-tokens", "-1", "--prompt", "hi"]) == 2
    assert "max_tokens" in capsys.readouterr().err and built == []
