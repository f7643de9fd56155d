"""A model directory's tokenizer: tokenizer.json via the tokenizers library, plus its chat template."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(ValueError):
    """The tokenizer files are missing or unusable."""


def _token_str(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


class Tokenizer:
    """Encodes, decodes and renders chat templates the way transformers does for the same files."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        file = p / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"{str(p)!r} has no tokenizer.json; pass prompt_token_ids, "
                                 "or point tokenizer= at a directory that has one")
        self._tok = HFTokenizer.from_file(str(file))
        cfg_file = p / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        template = cfg.get("chat_template")
        jinja_file = p / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        self.add_bos_token = bool(cfg.get("add_bos_token", False))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._compiled = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if (add_special_tokens and self.add_bos_token and self.bos_token_id is not None
                and (not ids or ids[0] != self.bos_token_id)):
            ids = [self.bos_token_id, *ids]
        return ids

    def encode_many(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of each text, through the tokenizers library's batch call, which releases the
        GIL while it works (its single ``encode`` holds it): from a thread, other Python code runs
        meanwhile."""
        out = [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            out = [ids if ids and ids[0] == self.bos_token_id else [self.bos_token_id, *ids] for ids in out]
        return out

    def vocab(self) -> dict[str, int]:
        """Every token's string (as the tokenizer stores it: byte-level tokens encoded) and id."""
        return self._tok.get_vocab(with_added_tokens=True)

    def backend_json(self) -> str:
        """The tokenizer as tokenizer.json holds it (a grammar engine reads its pre-tokenizer)."""
        return self._tok.to_str()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        if not self.chat_template:
            raise TokenizerError("this tokenizer has no chat template; use completions instead of chat")
        if self._compiled is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise TokenizerError(f"chat template: {message}")

            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)
            self._compiled = env.from_string(self.chat_template)
        return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                     **kwargs)
