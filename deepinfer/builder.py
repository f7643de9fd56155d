"""The composition root: EngineConfig -> plugin instances -> an assembled LLMEngine."""
from __future__ import annotations

from pathlib import Path

import pluggy
from stevedore import NamedExtensionManager

from deepinfer.core.block_pool import BlockPool
from deepinfer.core.config import EngineConfig
from deepinfer.core.context import EngineContext
from deepinfer.core.engine import LLMEngine
from deepinfer.core.graphs import default_batch_sizes, default_prefill_sizes, usable_prefill_sizes
from deepinfer.core.kv_manager import KVCacheManager, SlidingKV
from deepinfer.core.loader import load_model, resolve_dtype
from deepinfer.core.metrics import Metrics
from deepinfer.core.model_config import ModelConfigError, read_model_config
from deepinfer.core.model_registry import ModelRegistry
from deepinfer.core.model_runner import ModelRunner
from deepinfer.core.sampler import Sampler
from deepinfer.core.tokenizer import Tokenizer
from deepinfer.plugins import hookspecs
from deepinfer.plugins.discovery import MODELS_GROUP, PluginError, fresh, model_entry_points
from deepinfer.plugins.selection import Selection, instantiate_hooks, select


def demo_model_path() -> str:
    from deepinfer import DEMO_MODEL

    if not (Path(DEMO_MODEL) / "config.json").is_file():
        raise ModelConfigError(f"no model given and the embedded demo model is missing at {DEMO_MODEL}; "
                               "pass a model directory")
    return DEMO_MODEL


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


def build_kv_cache(ctx: EngineContext, model, attention, policies: list, dtype,
                   max_model_len: int) -> tuple[KVCacheManager, list]:
    """Size the KV pool(s) and allocate every layer's cache.

    One pool holds every layer's KV unless a cache policy asks for a pool of its own for the
    sliding-window layers (KV group 1, ``CachePolicy.sliding_pool_blocks``). Then that pool gets the
    blocks the policy asks for plus a null block, and the full-attention pool what is left of the
    budget (with ``num_kv_blocks`` set, exactly that many)."""
    config, device = ctx.config, ctx.device
    bs = config.block_size
    per_block = attention.kv_cache_bytes_per_block(ctx.layers, bs, dtype)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = 0 if config.num_kv_blocks else device.kv_cache_budget(model_bytes)
    shared = config.num_kv_blocks or budget // per_block
    num_sliding = next((n for p in policies if (n := p.sliding_pool_blocks(shared)) is not None), None)
    sliding_layers = [s for s in ctx.layers if s.sliding_window is not None]
    num_blocks = shared
    if num_sliding is not None:
        _check_sliding_pool(attention, sliding_layers, num_sliding, bs, config, max_model_len)
        ctx.layers = model.assign_kv_groups({s.layer_idx: 1 for s in sliding_layers})
        sliding_layers = [s for s in ctx.layers if s.kv_group == 1]
        full_layers = [s for s in ctx.layers if s.kv_group == 0]
        per_full = attention.kv_cache_bytes_per_block(full_layers, bs, dtype) if full_layers else 0
        per_sliding = attention.kv_cache_bytes_per_block(sliding_layers, bs, dtype)
        if not config.num_kv_blocks and per_full:
            num_blocks = (budget - (num_sliding + 1) * per_sliding) // per_full
    needed = -(-max_model_len // bs)
    if num_blocks < needed:
        raise ValueError(f"the KV pool has {num_blocks} blocks of {bs} tokens, fewer than one "
                         f"max_model_len ({max_model_len}) request needs ({needed}); give more KV memory "
                         "(num_kv_blocks, kv_cache_memory_gb) or lower max_model_len")
    tdev = device.torch_device
    if num_sliding is None:
        kv_caches = attention.allocate_kv_cache(ctx.layers, num_blocks, bs, dtype, tdev)
        kv = KVCacheManager(BlockPool(num_blocks, bs), policies)
    else:
        by_layer = dict(zip((s.layer_idx for s in full_layers),
                            attention.allocate_kv_cache(full_layers, num_blocks, bs, dtype, tdev) if full_layers
                            else [], strict=True))
        # one block more than the pool hands out: the null block of out-of-window table entries
        by_layer.update(zip((s.layer_idx for s in sliding_layers),
                            attention.allocate_kv_cache(sliding_layers, num_sliding + 1, bs, dtype, tdev),
                            strict=True))
        kv_caches = [by_layer[s.layer_idx] for s in ctx.layers]
        sliding = SlidingKV(BlockPool(num_sliding, bs), max(s.sliding_window for s in sliding_layers))
        sliding.bytes_per_block = per_sliding
        kv = KVCacheManager(BlockPool(num_blocks, bs), policies, sliding)
    for policy in policies:
        kv.pool.add_evict_listener(policy.on_evict)
        if kv.sliding is not None:
            kv.sliding.pool.add_evict_listener(policy.on_evict)
    return kv, kv_caches


def _check_sliding_pool(attention, sliding_layers: list, num_blocks: int, bs: int, config: EngineConfig,
                        max_model_len: int) -> None:
    if not attention.supports_kv_groups:
        raise PluginError(f"attention plugin {attention.name!r} cannot keep the sliding-window layers' KV in a "
                          "pool of their own, which the selected cache policy needs; use attention torch or "
                          "triton, or drop that cache policy")
    if not sliding_layers:
        raise PluginError("a cache policy asked for a KV pool for sliding-window layers, but the model has none")
    window = max(s.sliding_window for s in sliding_layers)
    step = min(max_model_len, window - 1 + config.max_num_batched_tokens)
    need = -(-step // bs) + 1
    if num_blocks < need:
        raise ValueError(f"the sliding-window KV pool has {num_blocks} blocks of {bs} tokens; one request "
                         f"needs {need} (its window of {window} plus one step of up to "
                         f"{config.max_num_batched_tokens} tokens); give it more blocks (the cache policy's "
                         "sliding_pool_blocks option, for swa-replay) or lower max_num_batched_tokens")


def build_engine(config: EngineConfig, progress: bool = True) -> LLMEngine:
    """Resolve plugins, load the model, size the KV pool and assemble the engine."""
    sel = select(config)
    model_path = config.model or demo_model_path()
    mcfg = read_model_config(model_path)
    registry = model_registry()
    registry.resolve(mcfg.architecture)  # fail before anything heavy happens
    max_model_len = config.max_model_len or mcfg.max_position_embeddings
    if max_model_len > mcfg.max_position_embeddings:
        raise ModelConfigError(f"max_model_len {max_model_len} exceeds the model's "
                               f"max_position_embeddings {mcfg.max_position_embeddings}")
    tok_dir = Path(config.tokenizer or model_path)
    if config.tokenizer is not None and not (tok_dir / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer {config.tokenizer!r}: no tokenizer.json there; give a directory holding "
                         "one (a Hugging Face model or tokenizer directory), or leave --tokenizer out to use "
                         "the model's")
    tokenizer = Tokenizer(tok_dir) if (tok_dir / "tokenizer.json").is_file() else None

    pm = plugin_manager(sel)
    pm.hook.deepinfer_config_finalized(config=config)
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
    device = device_cls(sel.options[dev_info.name], ctx)
    ctx.device = device
    attn_name = sel.one("attention").name
    attention = sel.classes[attn_name](sel.options[attn_name], ctx)
    dtype = resolve_dtype(config.dtype, mcfg, device.torch_device.type)
    model = load_model(mcfg, registry, attention, dtype, device.torch_device, progress)
    if (ops := device.fused_ops()) is not None:
        model.use_fused_ops(ops)
    if (linear_op := device.linear_op(dtype)) is not None:
        model.use_linear_op(linear_op)
    ctx.layers = model.attention_layers()

    policies = [sel.classes[i.name](sel.options[i.name], ctx) for i in sel.all("cache_policy")]
    kv, kv_caches = build_kv_cache(ctx, model, attention, policies, dtype, max_model_len)
    ctx.kv = kv
    sched_name = sel.one("scheduler").name
    scheduler = sel.classes[sched_name](sel.options[sched_name], ctx)
    ctx.dtype = dtype
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
    # graphs replay single-group decode steps (swa-replay's separate sliding-window pool runs eagerly)
    graphs = None if config.enforce_eager or kv.sliding is not None else device.graphs()
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
