"""EngineConfig: one pydantic model for every engine option, from defaults, file, env and flags."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENV_PREFIX = "DEEPINFER_"


class EngineConfig(BaseModel):
    """Engine options. Per-plugin options live in ``plugin_options[plugin_name]``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(None, description="model directory or Hugging Face Hub id, org/name (default: the "
                                                "embedded demo model)")
    revision: str | None = Field(None, description="a Hub model's revision: branch, tag or commit (default: main)")
    tokenizer: str | None = Field(None, description="tokenizer directory (default: the model's)")
    served_model_name: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field("auto", description="device plugin name, or auto")
    plugins: list[str] = Field(default_factory=list)
    plugin_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    block_size: int = Field(16, ge=1, le=1024)
    num_kv_blocks: int | None = Field(None, ge=1, description="fix the KV pool size in blocks")
    kv_cache_memory_gb: float | None = Field(None, gt=0, description="KV pool size in GiB")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_waiting_requests: int = Field(4096, ge=1)
    seed: int = 0
    quantization: Literal["fp8"] | None = Field(
        None, description="fp8: quantize the model's linear weights at load in 128x128 blocks (DeepSeek's "
                          "block-scaled e4m3) and run them through the device's FP8 GEMM; on a device without "
                          "one, the weights keep FP8's values in the model's dtype")
    enforce_eager: bool = Field(False, description="never capture device graphs (CUDA graphs): every step "
                                                   "runs eagerly")
    cuda_graph_sizes: list[int] | None = Field(
        None, description="decode batch sizes to capture (default 1, 2, 4, then multiples of 8 up to 256, "
                          "capped at max_num_seqs); a step pads to the next captured size")
    cuda_graph_prefill_sizes: list[int] | None = Field(
        None, description="token counts of the prefill graphs: a step of one sequence computing 2 to the largest "
                          "count of tokens (a prompt, a chunk, the rest after a cached prefix) replays the "
                          "smallest count >= its tokens, padded (default 16, 32, 64, 128, 256, 384, 512, 768, "
                          "1,024; counts past the first at or above max_num_batched_tokens and "
                          "max_seq_len_to_capture are left out; [] or 'none': no prefill graphs)")
    tensor_parallel_size: int = Field(
        1, ge=1, description="processes (ranks, one device each) that one model is split over by tensor "
                             "parallelism: attention heads, MLP columns and the vocabulary; rank 0 schedules and "
                             "samples. On one host the ranks are spawned; under a launcher that sets WORLD_SIZE "
                             "(torchrun) every rank runs the same command")
    data_parallel_size: int = Field(
        1, ge=1, description="ranks that each run their own requests through attention and the dense layers "
                             "(data-parallel attention; rank 0 still schedules and samples); with "
                             "enable_expert_parallel the routed experts are sharded over them, else every rank "
                             "holds the whole model. Not with tensor_parallel_size > 1 yet")
    enable_expert_parallel: bool = Field(
        False, description="shard a mixture-of-experts model's routed experts over the tensor_parallel_size x "
                           "data_parallel_size ranks (tokens sent to their experts' ranks with all-to-all); "
                           "runs with data_parallel_size ranks and tensor_parallel_size 1")
    num_redundant_experts: int = Field(
        0, ge=0, description="physical expert slots a MoE layer has beyond its experts, with "
                             "enable_expert_parallel (replicas of hot experts, placed by an expert-load-balancing "
                             "hook plugin)")
    batch_invariant: bool = Field(
        False, description="give a request the same bits whatever it is batched with: every matmul, "
                           "reduction and attention computes each row in an order that does not depend on "
                           "the batch, and a token the same way in prefill, decode, verification or after a "
                           "cached prefix (slower; refused by a device or attention plugin that cannot)")
    max_seq_len_to_capture: int = Field(8192, ge=1, description="longest sequence a captured decode step "
                                                                "covers; steps with longer ones run eagerly")

    @property
    def world_size(self) -> int:
        """Processes (ranks) one engine runs on: tensor_parallel_size x data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size

    @field_validator("plugins", mode="before")
    @classmethod
    def _split_plugins(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @field_validator("cuda_graph_sizes", mode="before")
    @classmethod
    def _split_sizes(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [int(x) for x in v.split(",") if x.strip()]
        return v

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _positive_sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError(f"cuda_graph_sizes must be a non-empty list of positive batch sizes, got {v}")
        return v

    @field_validator("cuda_graph_prefill_sizes", mode="before")
    @classmethod
    def _split_prefill_sizes(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().strip("[]")
            return [] if v.lower() in ("", "none") else [int(x) for x in v.split(",") if x.strip()]
        return v

    @field_validator("cuda_graph_prefill_sizes")
    @classmethod
    def _prefill_sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and v and min(v) < 2:
            raise ValueError(f"cuda_graph_prefill_sizes must be token counts of at least 2 (a step of one token "
                             f"is a decode step), got {v}; [] turns prefill graphs off")
        return v

    @field_validator("plugins")
    @classmethod
    def _no_duplicates(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in v:
            if name in seen:
                raise ValueError(f"plugin {name!r} is listed twice")
            seen.add(name)
        return v


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or TOML config file into a dict of options."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {str(p)!r} does not exist")
    text = p.read_text()
    kinds = {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}
    if p.suffix not in kinds:
        raise ValueError(f"config file {str(p)!r}: use a .yaml, .yml, .toml or .json file")
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # noqa: BLE001 (each parser has its own error types: one message for all)
        raise ValueError(f"config file {str(p)!r} is not valid {kinds[p.suffix]}: {e}") from None
    if not isinstance(data, dict):  # a bad file, reported like the other config errors
        raise ValueError(f"config file {str(p)!r} must hold a mapping of options")  # noqa: TRY004
    return data


def env_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Options from ``DEEPINFER_*`` variables (``DEEPINFER_MAX_NUM_SEQS=8``)."""
    environ = dict(os.environ if environ is None else environ)
    fields = EngineConfig.model_fields
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name == "plugins" or name not in fields:
            continue  # DEEPINFER_PLUGINS is an allow-list, read by the plugin machinery
        out[name] = parse_plugin_options(raw, key) if name == "plugin_options" else raw
    return out


def parse_plugin_options(text: str, source: str = "--plugin-options") -> dict[str, dict[str, Any]]:
    """``plugin_options`` from JSON text (a flag or an environment variable named ``source``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source} is not valid JSON ({e}); give an object such as "
                         '\'{"<plugin name>": {"<option>": <value>}}\'') from None
    return check_plugin_options(value, source)


def check_plugin_options(value: Any, source: str = "plugin_options") -> dict[str, dict[str, Any]]:
    """``value`` if it is a mapping of plugin names to mappings of options, else a ValueError."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise ValueError(f"{source} must map plugin names to objects of their options, e.g. "
                         f'{{"<plugin name>": {{"<option>": <value>}}}}; got {json.dumps(value, default=str)[:200]}')
    return value


def build_config(file: str | None = None, overrides: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None) -> EngineConfig:
    """Merge defaults < file < environment < explicit overrides (flags or keyword arguments).

    Top-level keys of the file that are not engine options are taken as per-plugin sections
    (``<plugin name>: {...}``) and checked later against the selected plugins. Plugin options merge
    option by option across the sources (a later source's value for an option wins; the plugin's
    other options stay).
    """
    merged: dict[str, Any] = {}
    opts: dict[str, dict[str, Any]] = {}

    def add_plugin_options(value: Any, source: str) -> None:
        for name, section in check_plugin_options(value or {}, source).items():
            opts.setdefault(name, {}).update(section)

    if file:
        for key, value in read_config_file(file).items():
            key = key.replace("-", "_") if key.replace("-", "_") in EngineConfig.model_fields else key
            if key == "plugin_options":
                add_plugin_options(value, f"config file {file!r}: plugin_options")
            elif key in EngineConfig.model_fields:
                merged[key] = value
            elif isinstance(value, dict):
                add_plugin_options({key: value}, f"config file {file!r}")
            else:
                valid = ", ".join(sorted(EngineConfig.model_fields))
                raise ValueError(f"config file {file!r}: unknown option {key!r}; valid options: {valid}, "
                                 "or a section named after a plugin")
    env = env_options(environ)
    add_plugin_options(env.pop("plugin_options", None), ENV_PREFIX + "PLUGIN_OPTIONS")
    merged.update(env)
    unknown = sorted(set(overrides or {}) - set(EngineConfig.model_fields))
    if unknown:  # (a typo in a keyword argument: name the valid ones, in one line)
        raise ValueError(f"unknown engine option {', '.join(map(repr, unknown))}; valid options: "
                         f"{', '.join(sorted(EngineConfig.model_fields))}")
    for key, value in (overrides or {}).items():
        if key == "plugin_options":
            add_plugin_options(value, "plugin_options")
        elif value is not None:
            merged[key] = value
    merged["plugin_options"] = opts
    return EngineConfig(**merged)
