"""The demo pair's data: the standard-library corpus, its train/held-out split, and the byte-level
BPE tokenizer with its files (see train_demo.py, which trains the models on them)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB_SIZE = 8192
MAX_POSITIONS = 2048

CORPUS_SUFFIXES = (".py", ".txt", ".rst")
CORPUS_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
CORPUS_MAX_FILE_BYTES = 200_000
HELDOUT_MODULUS = 20  # sha256(relative path) % 20 == 0 -> held out (~5%)

# One message per turn: <|role|>content<|end|>\n ; then <|assistant|> to prompt a reply.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('Unsupported role: ' + message['role']) }}"
    "{%- endif -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


# ----------------------------------------------------------------------------- corpus


@dataclass
class Corpus:
    root: str
    train_paths: list[str]
    train_texts: list[str]
    heldout_paths: list[str]
    heldout_texts: list[str]
    record: dict


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode("utf-8")).hexdigest()
    return int(digest, 16) % HELDOUT_MODULUS == 0


def collect_corpus(stdlib_dir: str | None = None, max_files: int | None = None) -> Corpus:
    """Gather the stdlib sources deterministically and split them train/held-out."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"]).resolve()
    candidates = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in CORPUS_EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(CORPUS_SUFFIXES):
                candidates.append(Path(dirpath) / name)
    files: list[tuple[str, str]] = []
    skipped_large = skipped_encoding = 0
    for path in sorted(candidates, key=lambda p: p.relative_to(root).as_posix()):
        if not path.is_file() or path.stat().st_size > CORPUS_MAX_FILE_BYTES:
            skipped_large += 1
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped_encoding += 1
            continue
        files.append((path.relative_to(root).as_posix(), text))
    if max_files is not None:
        files = files[:max_files]
    if not files:
        raise SystemExit(f"no corpus files found under {root}")

    digest = hashlib.sha256()
    for rel, text in files:
        data = text.encode("utf-8")
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    corpus = Corpus(str(root), [], [], [], [], {})
    for rel, text in files:
        if is_heldout(rel):
            corpus.heldout_paths.append(rel)
            corpus.heldout_texts.append(text)
        else:
            corpus.train_paths.append(rel)
            corpus.train_texts.append(text)
    corpus.record = {
        "source": "Python standard library (.py/.txt/.rst; no tests, idlelib or site-packages)",
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib_dir": str(root),
        "num_files": len(files),
        "num_train_files": len(corpus.train_paths),
        "num_heldout_files": len(corpus.heldout_paths),
        "total_chars": sum(len(t) for _, t in files),
        "skipped_too_large": skipped_large,
        "skipped_not_utf8": skipped_encoding,
        "max_files": max_files,
        "sha256": digest.hexdigest(),
        "heldout_rule": f"sha256(relative path) % {HELDOUT_MODULUS} == 0",
    }
    return corpus


# -------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE whose post-processor adds nothing (encode(text) is plain)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, tok in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(tok) == i, f"{tok} must have id {i}"
    assert tokenizer.get_vocab_size() <= vocab_size
    return tokenizer


def write_tokenizer_files(tokenizer, out_dir: Path) -> None:
    """tokenizer.json + the JSON files transformers' AutoTokenizer reads offline."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    specials = {
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "pad_token": SPECIAL_TOKENS[PAD_ID],
        "additional_special_tokens": SPECIAL_TOKENS[3:],
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, tok in enumerate(SPECIAL_TOKENS)
        },
    }
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", specials)


def encode_stream(tokenizer, texts: list[str]):
    """All texts tokenized (batch encoder, parallel) and joined, each followed by <|end|>;
    also the offset where each text starts."""
    import torch

    ids: list[int] = []
    starts: list[int] = []
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        starts.append(len(ids))
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(starts, dtype=torch.long)


def heldout_prompt_ids(heldout_texts: list[str], n: int, length: int, encode) -> list[list[int]]:
    """Up to n prompts of exactly `length` tokens (``encode``: text -> token ids): the beginnings
    of held-out files, later cycles starting further into each file, pieces too short skipped
    (fewer than n only when the files run out). `bench spec` and the demo pair's evaluation take
    their prompts here."""
    texts = [t for t in heldout_texts if len(t) > 4 * length]
    rows: list[list[int]] = []
    for i in range(n * 8 if texts else 0):
        if len(rows) == n:
            break
        offset = (i // len(texts)) * length
        ids = encode(texts[i % len(texts)][offset * 2:])[:length]
        if len(ids) == length:
            rows.append(ids)
    return rows


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
