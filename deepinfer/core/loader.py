"""Load a model's weights from *.safetensors (single file or sharded with an index), memory-mapped."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from deepinfer.core.interfaces import AttentionBackend
from deepinfer.core.model_config import ModelConfig, ModelConfigError
from deepinfer.core.model_registry import CausalLM, ModelRegistry


class WeightsError(ValueError):
    """The checkpoint's tensors do not match the model definition."""


def safetensors_files(path: str | Path) -> list[Path]:
    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (p / s).is_file()]
        if missing:
            raise WeightsError(f"{index} names shards that are missing: {missing}")
        return [p / s for s in shards]
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"model directory {str(p)!r} has no *.safetensors weights")
    return files


def iter_weights(path: str | Path, progress: bool = True,
                 shard: Callable[[str], tuple[int, int, int] | None] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors by name; with ``shard`` (a tensor-parallel model's ``weight_shard``),
    only the slice (dim, start, length) it names of each tensor is read (None: the whole tensor)."""
    files = safetensors_files(path)
    bar = tqdm(files, desc="Loading safetensors", disable=not progress or len(files) < 2, leave=False)
    for f in bar:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open has keys() but is not iterable)
                part = shard(name) if shard is not None else None
                if part is None:
                    yield name, st.get_tensor(name)
                else:
                    dim, start, length = part
                    yield name, st.get_slice(name)[(slice(None),) * dim + (slice(start, start + length),)]


def load_model(config: ModelConfig, registry: ModelRegistry, attention: AttentionBackend,
               dtype: torch.dtype, device: torch.device, progress: bool = True) -> CausalLM:
    """Build the registered model for ``config`` on ``device`` and fill it from the checkpoint."""
    cls = registry.resolve(config.architecture)
    with torch.device("meta"):
        model = cls(config, attention)
    model = model.to_empty(device=device).to(dtype)
    model.load_weights(iter_weights(config.path, progress, getattr(model, "weight_shard", None)))
    model.eval()
    return model


def resolve_dtype(requested: str, config: ModelConfig, device_type: str) -> torch.dtype:
    if requested == "auto":
        dtype = config.dtype
        # half precision matmuls on CPU are slow and lossy; auto means float32 there
        return torch.float32 if device_type == "cpu" and dtype == torch.float16 else dtype
    from deepinfer.core.model_config import DTYPES

    if requested not in DTYPES:
        raise ModelConfigError(f"dtype {requested!r} unsupported; use auto or one of {sorted(DTYPES)}")
    return DTYPES[requested]
