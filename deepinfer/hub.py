"""A model named as peers accept it: a local directory, or a Hugging Face Hub id (``org/name``)
resolved through huggingface_hub: downloaded into its cache, or read from there alone when
``HF_HUB_OFFLINE`` is set. Its revision comes from the config; the cache directory and the token
from huggingface_hub's usual variables (``HF_HOME``, ``HF_HUB_CACHE``, ``HF_TOKEN``)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from deepinfer.core.model_config import ModelConfigError

#: what a model directory needs: its config, tokenizer and chat template, and safetensors weights
#: (no pickled *.bin or *.pt: never loaded, so never downloaded)
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRUE = {"1", "on", "yes", "true"}


def _cache_dir() -> str | None:
    """huggingface_hub's cache directory from the environment now (its own constants are read once,
    when it is imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def resolve_model(name: str, revision: str | None = None) -> str:
    """The directory of the model ``name``: ``name`` itself when it is a directory or cannot be a
    Hub id (reading its config then says what is wrong with it), else the Hub snapshot of the
    repository ``name`` at ``revision`` (ModelConfigError saying what to do when it cannot be had)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if not _REPO_ID.match(name):  # (a path: reading its config says what is wrong with it)
        return str(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache, offline = _cache_dir(), _offline()
    where = f"revision {revision!r} of " if revision else ""
    try:
        snapshot = snapshot_download(name, revision=revision, cache_dir=cache, local_files_only=offline,
                                     allow_patterns=ALLOW_PATTERNS)
    except GatedRepoError:
        raise ModelConfigError(f"model {name!r} is gated on the Hugging Face Hub: accept its terms on its page and "
                               "set HF_TOKEN (or log in with `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ModelConfigError(f"model {name!r} is not a directory, and the Hugging Face Hub has no repository of "
                               "that name (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelConfigError(f"model {name!r} has no revision {revision!r} on the Hugging Face Hub") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise ModelConfigError(
            f"model {name!r} is not a directory, and {where}it is not in the Hugging Face cache "
            f"({cache or 'the default cache, ~/.cache/huggingface/hub'}), while {why}: download it there first "
            f"(`hf download {name}`) with the network on, or give a model directory") from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelConfigError(f"model {name!r}: the Hugging Face Hub could not be read ({e}); set "
                               "HF_HUB_OFFLINE=1 to use its cache alone, or give a model directory") from None
    if not any(Path(snapshot).glob("*.safetensors")):
        raise ModelConfigError(f"model {name!r} ({snapshot}) has no *.safetensors weights; deepinfer loads "
                               "safetensors only")
    return snapshot
