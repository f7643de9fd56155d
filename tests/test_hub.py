"""Models by Hugging Face Hub id: a model placed in a temporary cache laid out as huggingface_hub
writes it (blobs, snapshots of symlinks, refs) loads by ``org/name`` with ``HF_HUB_OFFLINE=1``, and
gives the tokens the same model gives from its directory."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.core.model_config import ModelConfigError
from deepinfer.hub import resolve_model
from tests.tiny_models import make_model


def place_in_cache(cache: Path, repo_id: str, model_dir: Path, commit: str, ref: str = "main",
                   skip: tuple[str, ...] = ()) -> Path:
    """Put ``model_dir``'s files in ``cache`` as huggingface_hub does for ``repo_id`` at ``commit``:
    each file a blob named by its hash, the snapshot a directory of relative symlinks to them, and
    ``refs/<ref>`` holding the commit. Return the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(model_dir.iterdir()):
        if f.name in skip:
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hub-src")
    make_model(path, "qwen3")
    return path


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_cached_hub_id_loads_offline_and_matches_its_directory(tiny, offline_cache):
    snapshot = place_in_cache(offline_cache, "acme/tiny-qwen3", tiny, "a" * 40)
    assert resolve_model("acme/tiny-qwen3") == str(snapshot)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}]
    by_id = LLM("acme/tiny-qwen3", dtype="float32", progress=False).generate(prompts, params, use_tqdm=False)
    by_dir = LLM(str(tiny), dtype="float32", progress=False).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in by_id] == [o.outputs[0].token_ids for o in by_dir]


def test_a_revision_picks_its_snapshot(tiny, offline_cache):
    place_in_cache(offline_cache, "acme/tiny-qwen3", tiny, "b" * 40)
    v2 = place_in_cache(offline_cache, "acme/tiny-qwen3", tiny, "c" * 40, ref="v2")
    assert resolve_model("acme/tiny-qwen3", revision="v2") == str(v2)
    assert resolve_model("acme/tiny-qwen3", revision="c" * 40) == str(v2)


def test_the_command_line_takes_a_hub_id(tiny, offline_cache, capsys):
    from deepinfer.cli import main

    place_in_cache(offline_cache, "acme/tiny-qwen3", tiny, "d" * 40)
    rc = main(["generate", "acme/tiny-qwen3", "--prompt", "a", "--max-tokens", "3", "--ignore-eos", "--json"])
    assert rc == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[0])["token_ids"]) == 3


def test_a_name_neither_a_directory_nor_cached_offline_is_a_clear_error(offline_cache):
    with pytest.raises(ModelConfigError) as e:
        resolve_model("acme/not-downloaded")
    msg = str(e.value)
    assert "not in the Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg and str(offline_cache) in msg
    assert resolve_model("./no/such/dir/here") == "no/such/dir/here"  # (a path: its config's reading fails)


def test_a_snapshot_without_safetensors_is_refused(tiny, offline_cache):
    names = [f.name for f in tiny.iterdir() if f.suffix == ".safetensors" or f.name.endswith(".index.json")]
    place_in_cache(offline_cache, "acme/pickled", tiny, "e" * 40, skip=tuple(names))
    with pytest.raises(ModelConfigError, match="safetensors only"):
        resolve_model("acme/pickled")


@pytest.mark.slow
def test_deepinfer_serve_takes_a_hub_id_and_serves_it_by_that_name(tiny, offline_cache):
    import httpx

    from tests.serve.conftest import ServerProcess

    place_in_cache(offline_cache, "acme/tiny-qwen3", tiny, "f" * 40)
    srv = ServerProcess("acme/tiny-qwen3")  # (its environment: this one, offline, with the cache above)
    try:
        assert [m["id"] for m in httpx.get(f"{srv.base_url}/v1/models").json()["data"]] == ["acme/tiny-qwen3"]
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"model": "acme/tiny-qwen3", "prompt": [5, 6, 7],
                                                               "max_tokens": 4, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        assert srv.stop() == 0
