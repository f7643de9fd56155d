"""The composition root: EngineConfig -> plugin instances -> an assembled LLMEngine."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy
import torch
import torch.distributed as dist
from stevedore import NamedExtensionManager

from deepinfer.core.config import EngineConfig
from deepinfer.core.context import EngineContext
from deepinfer.core.engine import LLMEngine
from deepinfer.core.graphs import default_batch_sizes, default_prefill_sizes, usable_prefill_sizes
from deepinfer.core.kv_blocks import KVBlocks
from deepinfer.core.kv_groups import build_kv_cache, kv_group_specs, windowed_policy
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.kv_partitions import PartitionedKV
from deepinfer.core.loader import load_model, resolve_dtype
from deepinfer.core.metrics import Metrics
from deepinfer.core.model_config import ModelConfigError, read_model_config
from deepinfer.core.model_registry import ModelRegistry
from deepinfer.core.model_runner import ModelRunner
from deepinfer.core.sampler import Sampler
from deepinfer.core.tokenizer import Tokenizer
from deepinfer.parallel.state import ExpertParallel, TensorParallel, building
from deepinfer.plugins import hookspecs
from deepinfer.plugins.discovery import MODELS_GROUP, PluginError, discover, fresh, load, model_entry_points
from deepinfer.plugins.selection import Selection, instantiate_hooks, select


def demo_model_path() -> str:
    from deepinfer import DEMO_MODEL

    if not (Path(DEMO_MODEL) / "config.json").is_file():
        raise ModelConfigError(f"no model given and the embedded demo model is missing at {DEMO_MODEL}; "
                               "pass a model directory")
    return DEMO_MODEL


def model_path_of(config: EngineConfig) -> str:
    """The model's directory: the config's model (a directory, or a Hub id resolved through
    huggingface_hub: ``deepinfer.hub``), else the embedded demo model."""
    if config.model is None:
        return demo_model_path()
    from deepinfer.hub import resolve_model

    return resolve_model(config.model, config.revision)


def model_registry() -> ModelRegistry:
    reg = ModelRegistry()

    def broken(_mgr, ep, exc: BaseException) -> None:  # (a broken model plugin fails its own architecture only)
        reg.register_broken(ep.name, f"model plugin {ep.name!r} ({ep.value}) failed to load: "
                                     f"{type(exc).__name__}: {exc}")

    names = [ep.name for ep in model_entry_points()]
    for ext in NamedExtensionManager(fresh(MODELS_GROUP), names=names, on_load_failure_callback=broken):
        reg.register(ext.name, ext.plugin)
    return reg


def plugin_manager(sel: Selection) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("deepinfer")
    pm.add_hookspecs(hookspecs)
    for obj in instantiate_hooks(sel):
        pm.register(obj)
    return pm


def assemble_kv_cache(ctx: EngineContext, model, attention, policies: list, dtype,
                      max_model_len: int) -> tuple[KVCacheManager, list]:
    """Group the model's layers into KV groups (the sliding-window ones apart where a cache policy
    asks, ``SeparatesWindowedKV``), check that the attention plugin can serve them, and size and
    allocate their pools (``deepinfer.core.kv_groups``)."""
    config = ctx.config
    windowed = windowed_policy(policies)
    groups = kv_group_specs(ctx.layers, windowed is not None, config.block_size, max_model_len,
                            config.max_num_batched_tokens)
    if windowed is not None:
        _check_windowed_groups(attention, windowed, groups)
    check_latent_support(attention, ctx.layers, ctx.model_config.get("architecture"))
    ctx.layers = model.assign_kv_groups({s.layer_idx: g.group_id for g in groups for s in g.layers})
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return build_kv_cache(ctx, groups, attention, policies, dtype, model_bytes, max_model_len)


def _check_windowed_groups(attention, policy, groups) -> None:
    if not attention.supports_kv_groups:
        raise PluginError(f"attention plugin {attention.name!r} cannot keep the sliding-window layers' KV in a "
                          f"pool of their own (it does not declare supports_kv_groups), which cache policy "
                          f"{policy.name!r} needs; choose an attention plugin that does, or drop that cache policy")
    if len(groups) == 1:
        raise PluginError(f"cache policy {policy.name!r} asked for a KV pool for sliding-window layers, but the "
                          "model has none")


def use_fp8(model, quantization: str | None, op) -> None:
    """``quantization: fp8``: the model's FP8-capable linear layers quantized in 128x128 blocks (run
    through the device's ``fp8_block_linear``, or put back in the model's dtype without one). A
    block-scaled FP8 checkpoint in DeepSeek's 128x128 blocks, loaded dequantized, is quantized again
    on the same blocks where the device has the GEMM (a block whose largest entry is +-448, as
    DeepSeek's quantizer leaves it, gets its checkpoint's float8 values back, up to the rounding of
    the model's dtype in between)."""
    linears = model.fp8_linears()
    if quantization == "fp8" and not linears:
        raise ValueError(f"quantization fp8 is not supported for {model.config.architecture}; it is for the "
                         "DeepSeek-V2/V3 architectures")
    if quantization == "fp8" or (op is not None and getattr(model, "fp8_block", None) == (128, 128)):
        for linear in linears:
            linear.quantize_fp8(op)


def check_latent_support(attention, layers, architecture: str | None) -> None:
    """Refuse an attention plugin (instance or class) that cannot serve the model's latent KV layers."""
    if attention.supports_latent_kv or not any(s.latent for s in layers):
        return
    raise PluginError(f"attention plugin {attention.name!r} cannot serve the latent KV cache of this model's "
                      f"layers ({architecture}: multi-head latent attention; it does not declare "
                      f"supports_latent_kv); choose one that does: {', '.join(latent_attention_plugins()) or '(none)'}")


def latent_attention_plugins() -> list[str]:
    """The names of the installed attention plugins that serve latent KV layers (each imported to ask)."""
    names = []
    for info in discover():
        if info.slot.name != "attention":
            continue
        try:
            if getattr(load(info), "supports_latent_kv", False):
                names.append(info.name)
        except Exception:  # noqa: BLE001, S112 (a plugin that cannot load here is no choice)
            continue
    return sorted(names)


@dataclass(slots=True)
class Shard:
    """What one rank runs: its device, attention backend, model (a shard of it with tensor
    parallelism) and KV caches."""

    ctx: EngineContext
    device: Any
    attention: Any
    model: Any
    dtype: Any
    ops: Any
    kv: KVCacheManager
    kv_caches: list


def _model_facts(config: EngineConfig):
    """The model directory, its config, the model registry and the context length, checked."""
    model_path = model_path_of(config)
    mcfg = read_model_config(model_path)
    registry = model_registry()
    registry.resolve(mcfg.architecture)  # fail before anything heavy happens
    max_model_len = config.max_model_len or mcfg.max_position_embeddings
    if max_model_len > mcfg.max_position_embeddings:
        raise ModelConfigError(f"max_model_len {max_model_len} exceeds the model's "
                               f"max_position_embeddings {mcfg.max_position_embeddings}")
    return model_path, mcfg, registry, max_model_len


def _load_shard(config: EngineConfig, sel: Selection, mcfg, registry: ModelRegistry, model_path: str,
                max_model_len: int, tp: TensorParallel, progress: bool, make_policies) -> Shard:
    """Device, attention backend, this rank's model and its KV caches (the pool the same size on
    every rank: the smallest any rank has memory for)."""
    ctx = EngineContext(config=config, metrics=Metrics(), model_path=model_path,
                        model_config={"vocab_size": mcfg.vocab_size, "architecture": mcfg.architecture,
                                      "max_model_len": max_model_len,
                                      "sliding_window": mcfg.sliding_window,
                                      "layer_types": mcfg.layer_types})
    dev_info = sel.one("device")
    device_cls = sel.classes[dev_info.name]
    reason = device_cls.unavailable_reason()
    if reason is not None:
        raise PluginError(f"device plugin {dev_info.name!r} cannot run here: {reason}")
    options = sel.options[dev_info.name]
    if tp.size > 1 and "device_index" in type(options).model_fields:  # (rank r: the r-th device from it)
        options = options.model_copy(update={"device_index": options.device_index + tp.local_rank})
    device = device_cls(options, ctx)
    if tp.size > 1 and device.torch_device.index is not None:  # (NCCL's communicators use the current device)
        torch.accelerator.set_device_index(device.torch_device.index)
    ctx.device = device
    attn_name = sel.one("attention").name
    attention = sel.classes[attn_name](sel.options[attn_name], ctx)
    if config.batch_invariant:
        refused = [f"{kind} plugin {name!r}: {why}" for kind, name, why in (
            ("device", dev_info.name, device.batch_invariance_unavailable()),
            ("attention", attn_name, attention.batch_invariance_unavailable())) if why is not None]
        if refused:
            raise PluginError("--batch-invariant cannot run here: " + "; ".join(refused) + " (built in, the cpu "
                              "device with the torch attention plugin runs it)")
    dtype = resolve_dtype(config.dtype, mcfg, device.torch_device.type)
    with building(*model_layout(config, tp)):
        model = load_model(mcfg, registry, attention, dtype, device.torch_device, progress)
    if (ops := device.fused_ops()) is not None:
        model.use_fused_ops(ops)
    if (linear_op := device.linear_op(dtype)) is not None:
        model.use_linear_op(linear_op)
    use_fp8(model, config.quantization, getattr(ops, "fp8_block_linear", None) if ops is not None else None)
    ctx.layers = model.attention_layers()
    policies = make_policies(ctx)
    if tp.size > 1:  # every rank's pool holds the same blocks: rank 0's block ids address them all
        ctx.config = config.model_copy(update={"num_kv_blocks": tp.smallest(
            _kv_blocks_here(ctx, model, attention, dtype), device.torch_device)})
    kv, kv_caches = assemble_kv_cache(ctx, model, attention, policies, dtype, max_model_len)
    return Shard(ctx, device, attention, model, dtype, ops, kv, kv_caches)


def _driver(config: EngineConfig, ranks, device, model, dtype, blocks_per_rank: int):
    """Rank 0's end of the other ranks (None: there are none)."""
    if ranks is None:
        return None
    if config.data_parallel_size > 1:
        from deepinfer.parallel.data_parallel import DataParallelDriver

        return DataParallelDriver(ranks, device.torch_device, model, dtype, blocks_per_rank)
    from deepinfer.parallel.driver import Driver

    return Driver(ranks, device.torch_device)


def model_layout(config: EngineConfig, world: TensorParallel) -> tuple[TensorParallel, ExpertParallel]:
    """How this rank's model is built: sharded over the tensor-parallel ranks (``world`` itself), or,
    with data parallelism, whole (dense layers) with the routed experts sharded over ``world`` when
    expert parallelism is on (else whole too: only the expert load counts are summed over it)."""
    if config.data_parallel_size == 1:
        return world, ExpertParallel()
    return TensorParallel(), ExpertParallel(world.rank, world.size, world.group, config.num_redundant_experts,
                                            shards_experts=config.enable_expert_parallel)


def _kv_blocks_here(ctx: EngineContext, model, attention, dtype) -> int:
    if ctx.config.num_kv_blocks:
        return ctx.config.num_kv_blocks
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return ctx.device.kv_cache_budget(model_bytes) // attention.kv_cache_bytes_per_block(
        ctx.layers, ctx.config.block_size, dtype)


def build_shard(config: EngineConfig, tp: TensorParallel, progress: bool = False) -> Shard:
    """Rank ``tp.rank``'s part of a tensor- or data-parallel engine (ranks 1..N-1: no scheduler, no
    sampler); ``tp`` is every rank's group."""
    sel = select(config)
    model_path, mcfg, registry, max_model_len = _model_facts(config)
    return _load_shard(config, sel, mcfg, registry, model_path, max_model_len, tp, progress, lambda ctx: [])


def build_engine(config: EngineConfig, progress: bool = True) -> LLMEngine:
    """Resolve plugins, load the model, size the KV pool and assemble the engine. With
    tensor_parallel_size or data_parallel_size > 1, this process is rank 0 and the other ranks are
    started first."""
    sel = select(config)
    model_path, mcfg, registry, max_model_len = _model_facts(config)
    tok_dir = Path(config.tokenizer or model_path)
    if config.tokenizer is not None and not (tok_dir / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer {config.tokenizer!r}: no tokenizer.json there; give a directory holding "
                         "one (a Hugging Face model or tokenizer directory), or leave --tokenizer out to use "
                         "the model's")
    tokenizer = Tokenizer(tok_dir) if (tok_dir / "tokenizer.json").is_file() else None
    pm = plugin_manager(sel)
    pm.hook.deepinfer_config_finalized(config=config)
    ranks = None
    if config.world_size > 1:  # (checked, then the other ranks started or joined)
        from deepinfer.parallel.launch import start_ranks

        ranks = start_ranks(config, sel, mcfg, registry.resolve(mcfg.architecture))
    elif config.enable_expert_parallel or config.num_redundant_experts:  # (one rank: checked all the same)
        from deepinfer.parallel.checks import check_expert_parallel

        check_expert_parallel(config, mcfg, registry.resolve(mcfg.architecture),
                              [sel.classes[i.name] for i in sel.all("cache_policy")])
    try:
        return _assemble(config, sel, mcfg, registry, model_path, max_model_len, tokenizer, pm, ranks, progress)
    except BaseException as e:
        if ranks is None:
            raise
        # (a failed collective is a RuntimeError on rank 0: the rank that failed tells why)
        why = ranks.worker_failure() if type(e) is RuntimeError or isinstance(e, dist.DistError) else None
        ranks.stop(0.0)  # (nothing left half-started)
        if why is None:
            raise
        raise RuntimeError(f"could not build the {ranks.label} engine: {why}") from e


def _assemble(config: EngineConfig, sel: Selection, mcfg, registry: ModelRegistry, model_path: str,
              max_model_len: int, tokenizer, pm, ranks, progress: bool) -> LLMEngine:
    tp = ranks.tp if ranks is not None else TensorParallel()
    def make_policies(ctx: EngineContext) -> list:
        return [sel.classes[i.name](sel.options[i.name], ctx) for i in sel.all("cache_policy")]

    shard = _load_shard(config, sel, mcfg, registry, model_path, max_model_len, tp, progress, make_policies)
    ctx, device, attention, model, dtype, ops = (shard.ctx, shard.device, shard.attention, shard.model,
                                                 shard.dtype, shard.ops)
    kv, kv_caches = shard.kv, shard.kv_caches
    blocks_per_rank = kv.pool.num_blocks
    if config.data_parallel_size > 1:  # (rank 0 plans every rank's pool: a request's blocks on its rank)
        kv = PartitionedKV(blocks_per_rank, config.data_parallel_size, config.block_size, kv.policies)
    driver = _driver(config, ranks, device, model, dtype, blocks_per_rank)  # (before a hook reads the model)
    pm.hook.deepinfer_model_loaded(model=model)  # (rank 0's: hook plugins run with the engine)
    config = ctx.config
    ctx.kv = kv
    full = [c for s, c in zip(ctx.layers, kv_caches, strict=True) if s.kv_group == 0]
    ctx.kv_blocks = KVBlocks.of(full, blocks_per_rank, config.block_size, device.torch_device)
    sched_name = sel.one("scheduler").name
    scheduler = sel.classes[sched_name](sel.options[sched_name], ctx)
    ctx.dtype = dtype
    attn_name = sel.one("attention").name
    ctx.new_attention = lambda: sel.classes[attn_name](sel.options[attn_name], ctx)
    def load_second_model(path: str, attn, model_dtype=None):
        second_dtype = model_dtype or dtype
        second = load_model(read_model_config(path), registry, attn, second_dtype, device.torch_device, progress)
        if ops is not None:
            second.use_fused_ops(ops)
        if (second_op := device.linear_op(second_dtype)) is not None:
            second.use_linear_op(second_op)
        return second

    ctx.load_model = load_second_model
    drafter = None
    if (info := sel.one("drafter")) is not None:
        drafter = sel.classes[info.name](sel.options[info.name], ctx)
    for obj in (device, attention, scheduler, *kv.policies, *([drafter] if drafter else [])):
        if any(n.startswith("deepinfer_") for n in dir(obj)):
            pm.register(obj)
    pm.hook.deepinfer_register_metrics(metrics=ctx.metrics)
    sampler = Sampler(config.seed)
    if ops is not None and getattr(ops, "argmax", None) is not None:
        sampler.argmax = ops.argmax
    runner = ModelRunner(model, attention, kv_caches, config.block_size, device.torch_device, sampler,
                         kv_groups=1 if kv.sliding is None else 2)
    runner.ranks = driver
    # graphs replay steps of one KV group (sliding-window layers in a pool of their own run eagerly);
    # steps of several ranks run eagerly too (graphs across ranks are untested)
    graphs = None if config.enforce_eager or kv.sliding is not None or ranks is not None else device.graphs()
    if graphs is not None and attention.supports_graphs:
        sizes = config.cuda_graph_sizes or default_batch_sizes(config.max_num_seqs)
        sizes = [s for s in sizes if s <= config.max_num_seqs] or [min(sizes)]
        max_len = min(config.max_seq_len_to_capture, max_model_len)
        # the prefill, the draft's, the target's decode and its verification graphs share one
        # memory pool (their replays never overlap); each set is captured largest first
        most = min(config.max_num_batched_tokens, max_len)  # a prefill step's most tokens
        prefill = config.cuda_graph_prefill_sizes
        prefill = default_prefill_sizes(most) if prefill is None else usable_prefill_sizes(prefill, most)
        if prefill:
            runner.enable_prefill_graphs(graphs, prefill, max_len)
        if drafter is not None:
            drafter.enable_graphs(graphs, sizes, max_len)
        runner.enable_graphs(graphs, sizes, max_len)
        if drafter is not None and drafter.max_draft_tokens:  # verification: last token + drafts
            runner.enable_verify_graphs(graphs, sizes, max_len, drafter.max_draft_tokens + 1)
    eos = list(mcfg.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    engine = LLMEngine(ctx, runner, scheduler, kv, tokenizer, max_model_len, eos, drafter, pm.hook)
    engine.plugin_names = {slot: [i.name for i in infos] for slot, infos in sel.chosen.items()}
    pm.hook.deepinfer_engine_started(engine=engine)
    return engine
