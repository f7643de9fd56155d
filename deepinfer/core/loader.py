"""Load a model's weights from *.safetensors (single file or sharded with an index), memory-mapped."""
from __future__ import annotations

import contextlib
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


#: torch.nn.init's in-place initialisers, which the layers' constructors call
_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def skipped_init() -> Iterator[None]:
    """torch.nn.init's initialisers leave their tensor as it is, while a model whose weights the
    checkpoint gives is built on the meta device: nothing there to initialise, and on meta tensors
    they run torch's Python decompositions, whose first use imports torch's compiler (2.7 s of
    every process's start here)."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITS if hasattr(torch.nn.init, name)}
    for name in saved:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def materialize(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give every meta parameter and buffer of ``model`` uninitialised memory on ``device``, floating
    point ones in ``dtype`` (``to_empty`` then ``to(dtype)`` would allocate each twice, and on meta
    tensors ``to_empty`` runs a decomposition that imports sympy: 0.8 s of a process's start)."""
    made: dict[int, torch.Tensor] = {}  # (a tensor two modules share, tied weights, stays one)

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)
            made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else new
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and t.is_meta:
                    table[name] = empty(t)


def load_model(config: ModelConfig, registry: ModelRegistry, attention: AttentionBackend,
               dtype: torch.dtype, device: torch.device, progress: bool = True) -> CausalLM:
    """Build the registered model for ``config`` on ``device`` and fill it from the checkpoint."""
    cls = registry.resolve(config.architecture)
    with torch.device("meta"), skipped_init():
        model = cls(config, attention)
    materialize(model, device, dtype)
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
