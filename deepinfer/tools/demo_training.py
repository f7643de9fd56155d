"""The training loop of the demo model pair (see train_demo.py): AdamW with warmup and cosine
decay, windows of the token stream (half at file starts), bf16 autocast on CUDA, and optional
distillation from a teacher."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass


def log(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class TrainSpec:
    name: str
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    distill_alpha: float = 1.0  # weight of next-token loss; (1 - alpha) goes to the KL term
    distill_temperature: float = 1.0


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at the last step."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * cosine)


def sample_batch(data, batch_size: int, seq_len: int, generator, doc_starts=None):
    """Windows of seq_len + 1 tokens over the token stream (on data's device). Half of them
    begin where a file begins, so the model also learns how files start: a prompt is a file's
    beginning, not a random point in the middle of one."""
    import torch

    max_start = data.numel() - seq_len - 1
    starts = torch.randint(0, max_start + 1, (batch_size,), generator=generator)
    if doc_starts is not None and len(doc_starts):
        pick = doc_starts[torch.randint(0, len(doc_starts), (batch_size,), generator=generator)]
        at_file_start = torch.rand(batch_size, generator=generator) < 0.5
        starts = torch.where(at_file_start, pick.clamp(max=max_start), starts)
    index = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    window = data[index.to(data.device)]
    return window[:, :-1], window[:, 1:]


def make_optimizer(model, spec: TrainSpec, device):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=device.type == "cuda")


def train_model(model, data, spec: TrainSpec, device, seed: int, log_every: int,
                teacher=None, eval_fn=None, eval_every: int = 0, doc_starts=None) -> dict:
    """One loop for CPU and CUDA; bf16 autocast on CUDA. Distils from teacher if given."""
    import torch
    import torch.nn.functional as F

    model.to(device).train()
    if teacher is not None:
        teacher.to(device).eval()
    optimizer = make_optimizer(model, spec, device)
    generator = torch.Generator().manual_seed(seed)
    autocast = {"device_type": device.type, "dtype": torch.bfloat16, "enabled": device.type == "cuda"}
    tokens_per_step = spec.batch_size * spec.seq_len
    curve, evals = [], []
    running = torch.zeros(3, device=device)  # loss, ce, kl summed since the last log
    since, start = 0, time.perf_counter()
    last_time, last_step = start, 0
    log(f"[{spec.name}] {spec.steps} steps x {spec.batch_size} x {spec.seq_len} tokens, "
        f"lr {spec.lr}, device {device.type}" + (", distilling" if teacher is not None else ""))
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, spec)
        inputs, labels = sample_batch(data, spec.batch_size, spec.seq_len, generator, doc_starts)
        with torch.autocast(**autocast):
            logits = model(input_ids=inputs).logits.float()
        flat = logits.view(-1, logits.size(-1))
        ce = F.cross_entropy(flat, labels.reshape(-1))
        kl = torch.zeros((), device=device)
        if teacher is not None:
            with torch.no_grad(), torch.autocast(**autocast):
                teacher_logits = teacher(input_ids=inputs).logits.float()
            t = spec.distill_temperature
            kl = F.kl_div(F.log_softmax(flat / t, dim=-1),
                          F.log_softmax(teacher_logits.view_as(flat) / t, dim=-1),
                          log_target=True, reduction="batchmean") * (t * t)
            loss = spec.distill_alpha * ce + (1.0 - spec.distill_alpha) * kl
        else:
            loss = ce
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()
        running += torch.stack([loss.detach(), ce.detach(), kl.detach()])
        since += 1
        done = step + 1
        if done % log_every == 0 or done == spec.steps:
            avg = (running / since).tolist()  # the only host sync of the loop
            now = time.perf_counter()
            tok_s = (done - last_step) * tokens_per_step / max(now - last_time, 1e-9)
            entry = {"step": done, "loss": avg[0], "ce": avg[1], "lr": lr_at(step, spec),
                     "tokens_per_s": tok_s, "elapsed_s": now - start}
            if teacher is not None:
                entry["kl"] = avg[2]
            curve.append(entry)
            extra = f" ce {avg[1]:.4f} kl {avg[2]:.4f}" if teacher is not None else ""
            log(f"[{spec.name}] step {done}/{spec.steps} loss {avg[0]:.4f}{extra} "
                f"lr {entry['lr']:.2e} {tok_s:,.0f} tok/s {now - start:.1f}s")
            running.zero_()
            since, last_time, last_step = 0, now, done
        if eval_fn is not None and eval_every and (done % eval_every == 0 or done == spec.steps):
            model.eval()
            heldout = eval_fn(model)
            model.train()
            evals.append({"step": done, "heldout_loss": heldout})
            log(f"[{spec.name}] step {done} held-out loss {heldout:.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    model.eval()
    return {"spec": asdict(spec), "steps": spec.steps, "tokens_seen": spec.steps * tokens_per_step,
            "train_time_s": elapsed, "final_train_loss": curve[-1]["loss"] if curve else None,
            "curve": curve, "heldout_during_training": evals}
