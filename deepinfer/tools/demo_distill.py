"""Self-distillation of the demo draft and the acceptance it buys (see train_demo.py).

A draft is worth what it gets accepted in greedy speculative decoding, and that depends on the text
the *target* writes, not on the stdlib text both models trained on. Two tools here:

* ``self_generated_stream`` -- the target's own greedy continuations of training-set prompts, as a
  token stream the draft can be distilled on (sequence-level distillation: the draft then sees, in
  training, the contexts it sees when it drafts);
* ``speculative_acceptance`` -- the exact outcome of greedy speculative decoding with k drafts a
  round, computed without an engine: the target writes its greedy continuation of held-out prompts,
  the draft reads it teacher-forced, and a round accepts the draft's run of matching next tokens.
  In greedy decoding the draft's i-th proposal is conditioned on accepted tokens only, which are
  the target's own, so the teacher-forced reading gives the same proposals the engine would make.
"""

from __future__ import annotations


def greedy_continue(model, prompts, new_tokens: int):
    """[batch, prompt + new_tokens]: prompts (equal lengths) and the model's greedy continuation,
    with the KV cache and no stop token (the benchmarks ignore end-of-text as well)."""
    import inspect

    import torch

    # transformers 5 names the cache argument and output `cache`, 4.x `past_key_values`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(new_tokens - 1):
            out = model(input_ids=tokens[-1], use_cache=True, **{name: out[name]})
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([prompts, *tokens], dim=1)


def self_generated_stream(target, train_ids, doc_starts, n_seqs: int, prompt_len: int,
                          new_tokens: int, batch: int, device, seed: int, end_id: int):
    """The target's greedy continuations of n_seqs training-set prompts (half at file starts), as
    one stream of (prompt + continuation + end) sequences, and where each sequence starts."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    last = train_ids.numel() - prompt_len
    starts = torch.randint(0, last, (n_seqs,), generator=generator)
    at_file = torch.rand(n_seqs, generator=generator) < 0.5
    picks = doc_starts[torch.randint(0, len(doc_starts), (n_seqs,), generator=generator)]
    starts = torch.where(at_file, picks.clamp(max=last - 1), starts)
    pieces = []
    target.eval()
    for i in range(0, n_seqs, batch):
        index = starts[i:i + batch, None] + torch.arange(prompt_len)[None, :]
        seqs = greedy_continue(target, train_ids[index].to(device), new_tokens)
        ends = torch.full((seqs.size(0), 1), end_id, dtype=seqs.dtype, device=seqs.device)
        pieces.append(torch.cat([seqs, ends], dim=1).cpu())
    stream = torch.cat(pieces).reshape(-1)
    width = prompt_len + new_tokens + 1
    return stream, torch.arange(0, stream.numel(), width, dtype=torch.long)


def speculative_acceptance(target, draft, prompts, new_tokens: int, k: int, device,
                           batch: int = 32) -> dict:
    """Greedy speculative decoding of `prompts` with k drafts a round, replayed as the engine runs
    it: the prompt's step makes the first new token, then each round drafts k tokens and accepts
    the run of drafts equal to the target's tokens, verifying none past `new_tokens` (as the engine
    caps them at max_tokens: with one token left, a plain step, not a round). Returns accepted drafts a round, tokens a target step, the accepted drafts
    at each position, and the acceptance at each position given the earlier ones accepted."""
    import torch

    prompt_len = prompts.size(1)
    matches = []
    for i in range(0, prompts.size(0), batch):
        seqs = greedy_continue(target, prompts[i:i + batch].to(device), new_tokens + k)
        with torch.no_grad():
            guess = draft(input_ids=seqs[:, :-1]).logits.argmax(-1)
        # matches[:, j]: the draft's guess of new token j + 1 equals the target's
        matches.append((guess[:, prompt_len:] == seqs[:, prompt_len + 1:]).cpu())
    rounds, reached, accepted = 0, [0] * k, [0] * k
    for row in torch.cat(matches).tolist():
        made = 1  # new tokens so far: the prompt's step made the first
        while made < new_tokens:
            limit = min(k, new_tokens - made - 1)  # (the drafts and the token after them fit)
            if limit == 0:
                made += 1
                continue
            run = 0
            while run < limit:
                reached[run] += 1
                if not row[made - 1 + run]:
                    break
                accepted[run] += 1
                run += 1
            rounds += 1
            made += run + 1
    total = sum(accepted)
    return {
        "prompts": int(prompts.size(0)), "prompt_tokens": prompt_len, "new_tokens": new_tokens,
        "k": k, "rounds": rounds,
        "accepted_per_round": total / rounds,
        "tokens_per_target_step": (total + rounds) / rounds,
        "accepted_by_position": accepted,
        "acceptance_by_position": [a / r if r else 0.0 for a, r in zip(accepted, reached)],
        "first_draft_acceptance": accepted[0] / reached[0],
    }
