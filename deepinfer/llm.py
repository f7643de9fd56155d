"""The offline API, shaped like vLLM's: ``LLM(model).generate(prompts, SamplingParams(...))``."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from deepinfer.builder import build_engine
from deepinfer.core.config import build_config
from deepinfer.core.model_registry import CountsExpertLoad
from deepinfer.core.request import RequestOutput
from deepinfer.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch
    from typing_extensions import Self  # typing.Self from Python 3.11

PromptType = str | dict[str, Any]


class LLM:
    """One engine in this process, for batch generation from Python. Arguments left None (device and
    dtype too) take the config file's, then the environment's, then the defaults ("auto")."""

    def __init__(self, model: str | None = None, *, tokenizer: str | None = None, device: str | None = None,
                 dtype: str | None = None, plugins: Sequence[str] | str | None = None,
                 config_file: str | None = None, progress: bool = True, **options: Any) -> None:
        overrides = {"model": model, "tokenizer": tokenizer, "device": device, "dtype": dtype,
                     "plugins": plugins, **options}
        self.config = build_config(config_file, overrides)
        self.engine = build_engine(self.config, progress=progress)
        self.engine.emit_unfinished = False  # generate() and chat() return whole outputs
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _parse(self, prompt: PromptType) -> tuple[list[int], str | None, str | None]:
        if isinstance(prompt, str):
            tok = self.engine.tokenizer
            if tok is None:
                raise ValueError("this model has no tokenizer.json: pass {'prompt_token_ids': [...]}")
            return tok.encode(prompt), prompt, None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt"), salt
            if "prompt" in prompt:
                ids, text, _ = self._parse(prompt["prompt"])
                return ids, text, salt
        raise TypeError("a prompt is a string or a dict with 'prompt' or 'prompt_token_ids' "
                        f"(and optionally 'cache_salt'), not {type(prompt).__name__}")

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of the prompts."""
        if isinstance(prompts, str | dict):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts; "
                                 "give one for all or one per prompt")
        parsed = [self._parse(p) for p in prompts]  # validate everything before adding anything
        ids = []
        try:
            for (tokens, text, salt), p in zip(parsed, params, strict=True):
                rid = str(next(self._ids))
                self.engine.add_request(rid, tokens, p, prompt=text, cache_salt=salt)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm, leave=False)
        try:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        except BaseException:
            for rid in ids:
                if rid not in done:
                    self.engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [done[rid] for rid in ids]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | None = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Render each conversation with the tokenizer's chat template and generate."""
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer, so it has no chat template")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [tok.apply_chat_template(c, add_generation_prompt=add_generation_prompt) for c in convs]
        return self.generate([{"prompt_token_ids": tok.encode(p, add_special_tokens=False), "prompt": p}
                              for p in prompts], sampling_params, use_tqdm)

    def get_metrics(self) -> dict[str, float]:
        return self.engine.get_metrics()

    def expert_load(self) -> torch.Tensor:
        """Tokens each routed expert received, per MoE layer, since the model was loaded or
        ``reset_expert_load``: int64 [num_moe_layers, num_routed_experts] (a token counts once for
        each of its top-k experts)."""
        return self._expert_counter().expert_load()

    def reset_expert_load(self) -> None:
        self._expert_counter().reset_expert_load()

    def _expert_counter(self) -> CountsExpertLoad:
        model = self.engine.runner.model
        if not isinstance(model, CountsExpertLoad):
            raise TypeError(f"model {self.engine.ctx.model_config.get('architecture')!r} has no routed experts to "
                             "count the load of (expert load is counted by mixture-of-experts models such as "
                             "DeepSeek-V2/V3)")
        return model

    def shutdown(self) -> None:
        """Abort anything still running and run the engine-stopped hooks."""
        self.engine.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
