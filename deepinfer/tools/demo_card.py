"""Evaluation and model cards for the demo model pair (see train_demo.py).

The evaluation reloads the saved directories with transformers' Auto classes
(so it also proves they load offline) and upcasts the bf16 weights to float32,
so the numbers describe exactly the weights that ship.
"""

from __future__ import annotations

import math
from pathlib import Path

PROMPTS = ["import os\n", "def read_config(path):\n"]
NEW_TOKENS = 64


def heldout_windows(ids, n_windows: int, seq_len: int):
    """n_windows deterministic, evenly spaced windows of seq_len + 1 tokens."""
    import torch

    seq_len = min(seq_len, ids.numel() - 1)
    last = ids.numel() - seq_len - 1
    starts = torch.linspace(0, last, n_windows).round().long() if n_windows > 1 else torch.zeros(1).long()
    return torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()])


def _logits(model, windows, device, batch_size: int):
    import torch

    for i in range(0, windows.size(0), batch_size):
        chunk = windows[i:i + batch_size].to(device)
        with torch.no_grad():
            yield chunk[:, 1:], model(input_ids=chunk[:, :-1]).logits.float()


def mean_loss(model, windows, device, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) over all window positions."""
    import torch.nn.functional as F

    total, count = 0.0, 0
    for labels, logits in _logits(model, windows, device, batch_size):
        total += F.cross_entropy(logits.view(-1, logits.size(-1)), labels.reshape(-1),
                                 reduction="sum").item()
        count += labels.numel()
    return total / count


def greedy_agreement(target, draft, windows, device, batch_size: int = 8) -> float:
    """Fraction of positions where the draft's greedy next token equals the target's."""
    same, count = 0, 0
    pairs = zip(_logits(target, windows, device, batch_size), _logits(draft, windows, device, batch_size))
    for (_, t_logits), (_, d_logits) in pairs:
        same += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        count += t_logits.shape[0] * t_logits.shape[1]
    return same / count


def greedy_continuations(model, tokenizer, device) -> dict[str, str]:
    import torch

    result = {}
    for prompt in PROMPTS:
        enc = tokenizer(prompt, return_tensors="pt").to(device)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        result[prompt] = tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=False)
    return result


def evaluate_pair(target_dir: Path, draft_dir: Path, heldout_ids, n_windows: int, seq_len: int,
                  device, spec=None) -> dict:
    """Held-out loss of both, greedy agreement, sample continuations and, given spec (a function
    of the two models), the replay of greedy speculative decoding (see demo_distill.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assert tokenizer("import os\n")["input_ids"] == tokenizer.encode("import os\n", add_special_tokens=False)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                         add_generation_prompt=True, tokenize=False)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).to(device).eval()
    windows = heldout_windows(heldout_ids, n_windows, seq_len)
    vocab = target.config.vocab_size
    metrics = {
        "heldout_windows": int(windows.size(0)),
        "heldout_window_tokens": int(windows.size(1) - 1),
        "heldout_positions": int(windows.size(0) * (windows.size(1) - 1)),
        "uniform_loss": math.log(vocab),
        "weights_evaluated": "bf16 safetensors upcast to float32",
        "chat_template_example": chat,
    }
    for role, model in (("target", target), ("draft", draft)):
        loss = mean_loss(model, windows, device)
        metrics[role] = {"heldout_loss": loss, "heldout_ppl": math.exp(loss)}
    metrics["greedy_agreement"] = greedy_agreement(target, draft, windows, device)
    if spec is not None:
        metrics["speculative"] = spec(target, draft)
    metrics["target_continuations"] = greedy_continuations(target, tokenizer, device)
    return metrics


# ------------------------------------------------------------------------ model card


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def model_card(role: str, log: dict) -> str:
    """README.md for demo-<role>, with the numbers of both models."""
    other = "draft" if role == "target" else "target"
    m, c, tr = log["metrics"], log["corpus"], log["training"]
    if role == "target":
        arch = ("Qwen3 decoder, 8 layers (hybrid attention: layers 0-2 and 4-6 sliding window of "
                "256 tokens, layers 3 and 7 full attention), hidden 384, 6 query heads / 2 KV heads "
                "of dim 64, MLP 1024, tied embeddings, RoPE theta 10000, context 2048")
        purpose = ("the *target* model of deepinfer's demo pair; its draft for speculative decoding "
                   "is `demo-draft`")
    else:
        # (logs from before train-demo had these options: the 2-layer draft of then)
        layers, mlp = log["settings"].get("draft_layers", 2), log["settings"].get("draft_mlp", 768)
        arch = (f"Qwen3 decoder, {layers} full-attention layers, hidden 256, 4 query heads / 2 KV heads of "
                f"dim 64, MLP {mlp}, tied embeddings, RoPE theta 10000, context 2048")
        purpose = ("the *draft* model of deepinfer's demo pair, for speculative decoding of "
                   "`demo-target` (same tokenizer and vocabulary)")
    spec = tr[role]["spec"]
    # the run that trained this model: the target's is kept apart when a later run trained the draft
    run = log["target_run"] if role == "target" and "target_run" in log else log
    how = (f"{tr[role]['steps']} AdamW steps of {spec['batch_size']} x {spec['seq_len']} tokens, "
           f"peak lr {spec['lr']}, warmup {spec['warmup']} + cosine decay; half of the windows start "
           f"where a file starts, the rest anywhere")
    if role == "draft":
        how += (f"; loss = {spec['distill_alpha']} x next-token cross-entropy + "
                f"{1 - spec['distill_alpha']:.2f} x KL(target || draft) at temperature "
                f"{spec['distill_temperature']}, the trained target frozen as teacher")
        self_distill = tr[role].get("self_distillation")
        if self_distill:
            how += (f"; the windows are drawn from the corpus and, beside it, from "
                    f"{_fmt_int(self_distill['tokens'])} tokens of the target's own greedy "
                    f"continuations ({self_distill['new_tokens']} tokens) of "
                    f"{_fmt_int(self_distill['sequences'])} training-set prompts of "
                    f"{self_distill['prompt_tokens']} tokens (self-distillation)")
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [deepinfer, demo, tiny, qwen3]",
        "---",
        "",
        f"# deepinfer demo-{role}",
        "",
        (f"A **tiny** causal language model trained from scratch by `deepinfer train-demo` "
        f"(`deepinfer/tools/train_demo.py`). It is {purpose}."),
        "",
        ("It exists so that deepinfer's examples and tests can run a real Hugging Face model "
        "offline, in seconds, on a CPU. It was trained briefly (see below) on Python standard "
        "library source code only: it produces Python-looking text, often wrong, knows nothing "
        "else, and follows no instructions (it never saw chat-formatted data, although the "
        "tokenizer has a chat template). **Do not use it for anything real.**"),
        "",
        "## Model",
        "",
        f"- Architecture: {arch}.",
        f"- Parameters: {_fmt_int(log['params'][role])} (the {other}: {_fmt_int(log['params'][other])}).",
        "- Weights: bfloat16 safetensors.",
        f"- Tokenizer: byte-level BPE, {log['tokenizer']['vocab_size']} tokens, trained on the same "
        "corpus; special tokens " + ", ".join(f"`{t}`={i}" for i, t in enumerate(log["tokenizer"]["special_tokens"]))
        + ". Encoding adds no special tokens. Chat template: `<|role|>content<|end|>` and a newline "
        "per message, then `<|assistant|>` as the generation prompt.",
        "",
        "## Training data",
        "",
        f"- {c['source']}, Python {c['python_version']} ({c['python_implementation']}).",
        (f"- {c['num_files']} files ({_fmt_int(c['total_chars'])} characters); {c['num_heldout_files']} "
        f"held out by `{c['heldout_rule']}`."),
        f"- Corpus digest (sha256 over the sorted relative paths and contents): `{c['sha256']}`.",
        (f"- Training tokens in the corpus: {_fmt_int(log['tokenizer']['train_tokens'])}; held-out "
        f"tokens: {_fmt_int(log['tokenizer']['heldout_tokens'])}."),
        "",
        "## Training",
        "",
        f"- {how}.",
        (f"- Tokens seen: {_fmt_int(tr[role]['tokens_seen'])}; training time "
        f"{tr[role]['train_time_s']:.0f} s on {run['device']}."),
        (f"- Seed {run['settings']['seed']} (CUDA runs are not bit-exact: a rerun differs slightly); "
         f"torch {run['versions']['torch']}, transformers {run['versions']['transformers']}, "
         f"tokenizers {run['versions']['tokenizers']}."),
        "",
        "## Evaluation (held-out stdlib files)",
        "",
        (f"{m['heldout_windows']} evenly spaced windows of {m['heldout_window_tokens']} tokens "
        f"({_fmt_int(m['heldout_positions'])} predicted positions); {m['weights_evaluated']}."),
        "",
        "| model | params | loss (nats/token) | perplexity |",
        "| --- | --- | --- | --- |",
        (f"| demo-target | {_fmt_int(log['params']['target'])} | {m['target']['heldout_loss']:.4f} "
        f"| {m['target']['heldout_ppl']:.2f} |"),
        (f"| demo-draft | {_fmt_int(log['params']['draft'])} | {m['draft']['heldout_loss']:.4f} "
        f"| {m['draft']['heldout_ppl']:.2f} |"),
        (f"| uniform guess | - | {m['uniform_loss']:.4f} (ln {log['tokenizer']['vocab_size']}) "
        f"| {math.exp(m['uniform_loss']):.0f} |"),
        "",
        (f"Draft greedy next token equals the target's at {100 * m['greedy_agreement']:.1f}% of the "
        "held-out positions."),
        "",
        *_speculative_lines(m.get("speculative")),
        f"## Greedy continuations of demo-target ({NEW_TOKENS} new tokens at most)",
        "",
    ]
    for prompt, text in m["target_continuations"].items():
        lines += [f"Prompt `{prompt!r}`:", "", "````python", prompt + text, "````", ""]
    return "\n".join(lines)


def _speculative_lines(spec: dict | None) -> list[str]:
    if not spec:
        return []
    by_pos = ", ".join(f"{100 * a:.0f}%" for a in spec["acceptance_by_position"])
    return [(f"Greedy speculative decoding of the target's continuations ({spec['new_tokens']} tokens) "
             f"of {spec['prompts']} held-out prompts of {spec['prompt_tokens']} tokens, replayed "
             f"exactly with {spec['k']} drafts a round: {spec['accepted_per_round']:.2f} drafts "
             f"accepted a round ({spec['tokens_per_target_step']:.2f} tokens a target step); "
             f"acceptance at draft positions 1-{spec['k']}, given the earlier ones accepted: "
             f"{by_pos}."), ""]


def summary(log: dict) -> str:
    m = log["metrics"]
    return (f"done in {log['timings_s']['total_s']:.1f}s: held-out loss target "
            f"{m['target']['heldout_loss']:.4f} (ppl {m['target']['heldout_ppl']:.1f}), draft "
            f"{m['draft']['heldout_loss']:.4f} (ppl {m['draft']['heldout_ppl']:.1f}), uniform "
            f"{m['uniform_loss']:.4f}; greedy agreement {m['greedy_agreement']:.3f}; "
            + (f"accepted {m['speculative']['accepted_per_round']:.2f} a round of "
               f"{m['speculative']['k']}; " if "speculative" in m else "") +
            f"weights {log['total_weight_bytes'] / 1e6:.2f} MB")
