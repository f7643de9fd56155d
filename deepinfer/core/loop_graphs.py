"""A second model's round of k decode steps in one device graph (greedy or sampled), and rounds
chained behind a verification: a drafter's rounds (``SecondModel.run_loop``, ``run_chained``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from deepinfer.core.graphs import DecodeGraphs
from deepinfer.core.host_copy import HostCopy
from deepinfer.core.interfaces import DeviceTokens
from deepinfer.core.sampler import draw_rows
from deepinfer.core.sampling_filters import GREEDY, distributions


class LoopRound:
    """A loop round's output [n, 2, k] (each step's token and its probability), copied to the
    host behind the round's device work; read (waiting for the copy) only when needed. ``source``:
    its tokens as device tokens (``DraftProposal.source``), when it leaves them on the device;
    ``q``: a sampled round's distributions [n, k, V] (None for a greedy round)."""

    def __init__(self, out: torch.Tensor, lazy: bool, q: torch.Tensor | None = None) -> None:
        self.copy = HostCopy(out)
        self.q = q
        self._lists: list | None = None
        # (one kernel: the conversion writes the strided tokens out contiguously)
        tokens = out[:, 0].to(torch.long, memory_format=torch.contiguous_format).view(-1) if lazy else None
        self.source = DeviceTokens(tokens, self.all_tokens) if lazy else None

    def lists(self) -> list:
        """[tokens, probabilities], each [n][k] (tokens as floats: exact below 2^24)."""
        if self._lists is None:
            self._lists = self.copy.wait().transpose(0, 1).tolist()
        return self._lists

    def tokens(self, i: int) -> list[int]:
        return [int(t) for t in self.lists()[0][i]]

    def all_tokens(self) -> list[int]:
        return [int(t) for row in self.lists()[0] for t in row]


class DraftLoopGraphs(DecodeGraphs):
    """A round's k draft steps in one replay (a greedy round's; with ``sampled``, a sampled
    round's: ``run_sampled``). The first step computes each sequence's new
    tokens, one to ``first`` of them (2 by default: the target's token, behind the last accepted
    draft when all were accepted; more where rounds may follow a lookup's), laid out as in the
    verification graphs (``run_padded``); then each step's argmax (or drawn token) becomes the next step's one
    token, on the device. The later steps' positions, slots and lengths follow from the first's,
    so the host writes them for all k - 1 steps with the round's inputs (padding rows stay at
    slot -1 and length 0: they write nothing). The output holds every step's token and
    probability, [size, 2, k] (float32: token ids below 2^24 are exact): one launch and one copy
    to the host a round, instead of k launches each waiting for its token.

    Chained rounds (``run_chained``): a round that follows a greedy verification of the last
    round's drafts can be queued before the host has read that verification. The host writes
    each sequence's length before the verified tokens (``base``), where its target tokens lie in
    the verification's output (``vrows``) and its drafts in the last round's output (``drows``);
    a small graph of its own (``_chain_inputs``) then counts the accepted drafts on the device and
    writes the first step's tokens, positions, slots and lengths from them."""

    #: the most logits a step of a sampled round's graph holds (its float64 sums are 8 bytes an
    #: entry): larger sizes are not captured, and rounds of more sequences draft step by step
    SAMPLED_MAX_ELEMENTS = 1 << 24

    def __init__(self, one: DecodeGraphs, steps: int, first: int = 2, sampled: bool | None = None,
                 q_out: torch.Tensor | None = None) -> None:
        """``sampled`` (None: greedy rounds): the graphs of sampled rounds (``run_sampled``), whose
        filters sort the logits (True: top-k or top-p in some row) or not (False), for the sizes
        of ``one`` whose logits fit ``SAMPLED_MAX_ELEMENTS`` (``sampled_sizes``); each step writes
        its distributions into ``q_out`` [max size, k, V] (float32; the sets may share one, since
        a round's are copied out right after its replay)."""
        self.steps = steps  # (before the base class lays out its inputs, which hold the later steps' too)
        self.sampled = sampled
        self.q_out = q_out
        sizes = one.sizes if sampled is None else sampled_sizes(one)
        super().__init__(one.model, one.attention, one.kv_caches, one.api, one.device, one.block_size, sizes,
                         one.max_seq_len, query_len=first, placeholders=False)
        self.one = one  # the later steps run the one-token graphs' forward on the inputs below
        dev = one.device
        self._best = torch.zeros(self.max_batch * (steps + 1), dtype=torch.long, device=dev)  # target tokens
        self._drafts = torch.zeros(self.max_batch * steps, dtype=torch.long, device=dev)  # the verified drafts
        self._chains: dict[int, tuple] = {}  # size -> the captured replay of its chained inputs
        #: per host buffer, an event after the last replay whose inputs it held: a chained round's
        #: upload is queued behind a verification the host does not wait for before it fills a
        #: buffer again, so it waits for this (done long before, in practice)
        self._read: list[torch.Event | None] = [None, None]

    def _fields(self):
        later, k = self.steps - 1, self.steps
        fields = {**super()._fields(), "step_pos": (torch.long, lambda b: (later, b)),
                  "step_slots": (torch.long, lambda b: (later, b)), "step_lens": (torch.int32, lambda b: (later, b)),
                  "base": (torch.long, lambda b: (b,)), "vrows": (torch.long, lambda b: (b, k + 1)),
                  "drows": (torch.long, lambda b: (b, k))}
        if self.sampled is not None:  # each row's sampling parameters (sampling_rows) and k uniform numbers
            fields |= {"sampling": (torch.float64, lambda b: (6, b)), "uniforms": (torch.float64, lambda b: (k, b))}
        return fields

    def capture(self) -> None:
        super().capture()
        for b in reversed(self.sizes) if self.sampled is None else ():
            self.inputs.blank(b)  # (the sizes' layouts share the buffer: rows in range at capture)
            self._chains[b] = self.api.capture(lambda b=b: self._chain_inputs(b))
        self.inputs.reset_turn()

    def _await_turn(self) -> None:
        """Before the host buffer of this turn is filled: the replay that last read it has run."""
        if (event := self._read[self._turn]) is not None:
            event.synchronize()

    def _mark_read(self) -> None:
        if self.device.type != "cpu":
            self._read[self._filled] = torch.Event(self.device)
            self._read[self._filled].record()

    def run_sampled(self, size: int, tokens, starts, tables, sampling: np.ndarray,
                    uniforms: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled round (graphs made with ``sampled``), as ``run_padded``, sequence i's draft
        at step j drawn from its distribution with ``uniforms[i, j]`` ([n, k]) and its sampling
        parameters ``sampling[:, i]`` (``sampling_rows``' array; its greedy rows take the argmax):
        (the output, as ``run_padded``'s, each step's token and its probability under the
        distribution it was drawn from (a greedy row's: its softmax's); the distributions
        [n, k, V], copied out of the graphs' memory)."""
        n = len(tokens)
        self._await_turn()  # (before the buffer is written: the copy that last read it has run)
        host = self.inputs.host(self._turn, size)  # (what run_padded fills next)
        rows = host["sampling"]
        rows[:] = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0])[:, None]  # padding: greedy
        rows[:, :n] = sampling
        host["uniforms"][:] = 0.0
        host["uniforms"][:, :n] = uniforms.T
        out = self.run_padded(size, tokens, starts, tables)
        return out, self.q_out[:n].clone()

    def run_padded(self, size, tokens, starts, tables, on_device=None, prev_tokens=None) -> torch.Tensor:
        self._await_turn()
        host = self.inputs.host(self._turn, size)  # the buffer the base class's run_padded fills next
        later, bs = self.steps - 1, self.block_size
        pos, slots, lens = [0] * (later * size), [-1] * (later * size), [0] * (later * size)  # [later, size]
        for i, (toks, start, blocks) in enumerate(zip(tokens, starts, tables, strict=True)):
            for j in range(later):  # step j + 1's one token sits j + 1 places after the first step's last
                p = start + len(toks) + j
                pos[j * size + i], lens[j * size + i], slots[j * size + i] = p, p + 1, blocks[p // bs] * bs + p % bs
        for name, values in (("step_pos", pos), ("step_slots", slots), ("step_lens", lens)):
            host[name].reshape(-1)[:] = values
        out = super().run_padded(size, tokens, starts, tables, on_device=on_device, prev_tokens=prev_tokens)
        self._mark_read()
        return out

    def run_chained(self, size: int, best: torch.Tensor, drafts: torch.Tensor, bases: Sequence[int],
                    vstarts: Sequence[int], dstarts: Sequence[int], tables: Sequence[Sequence[int]]) -> torch.Tensor:
        """The round after a greedy verification whose target tokens (each verified row's argmax)
        are ``best`` and whose drafts were ``drafts``, both still on the device: sequence i had
        ``bases[i]`` tokens before the verified ones, its k + 1 target tokens are
        ``best[vstarts[i]:vstarts[i] + k + 1]`` and its k drafts ``drafts[dstarts[i]:dstarts[i] + k]``
        (``vrows`` and ``drows`` of the inputs). The draft's cache holds its tokens up to the base and its drafts but the last;
        the first step computes the target's token after the accepted drafts (behind the last
        draft when all were accepted). Returns the whole output, as ``run_padded``."""
        self._await_turn()
        host = self._next_host(size)
        n, mb = len(bases), self.max_blocks
        tab = host["tables"]
        tab[:] = 0
        for i, blocks in enumerate(tables):
            nb = min(len(blocks), mb)
            tab[i, :nb] = blocks[:nb]
        host["base"][:] = -1  # padding
        host["base"][:n] = bases
        k = self.steps
        host["vrows"][:] = 0
        host["vrows"][:n] = np.asarray(vstarts)[:, None] + np.arange(k + 1)
        host["drows"][:] = 0
        host["drows"][:n] = np.asarray(dstarts)[:, None] + np.arange(k)
        self._best[:best.numel()].copy_(best)
        self._drafts[:drafts.numel()].copy_(drafts)
        self.inputs.upload(self._filled, size)
        self._chains[size][0]()
        replay, out = self._replays[size]
        replay()
        self._mark_read()
        return out

    def _chain_inputs(self, size: int) -> torch.Tensor:
        """(Captured.) The chained round's inputs from ``base``, ``vrows`` and ``drows`` (see
        ``run_chained``): in one kernel where the device's fused ops offer it, else in torch."""
        ins, q = self.inputs.device(size), self.query_len
        out = {"ids": ins["ids"].view(size, q), "pos": ins["pos"].view(size, q), "slots": ins["slots"].view(size, q),
               "lens": ins["lens"], "ctx": ins["ctx"], "single": ins["single"], "step_pos": ins["step_pos"],
               "step_slots": ins["step_slots"], "step_lens": ins["step_lens"]}
        fill = getattr(self.fused_ops, "chain_inputs", None) or chain_inputs
        fill(ins["base"], ins["vrows"], ins["drows"], self._best, self._drafts, ins["tables"], self.block_size, out)
        return ins["lens"]

    def captured_work(self, batch) -> torch.Tensor:
        b = batch.seq_lens.shape[0]
        new = batch.seq_lens - batch.context_lens  # 1 to query_len new tokens; 0 for padding
        last = torch.arange(b, device=new.device) * self.query_len + (new.long() - 1).clamp(min=0)
        one, ins = self.one._batch(b), self.inputs.device(b)

        def pick(hidden: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            return self._argmax(hidden) if self.sampled is None else self._draw(ins, hidden, step)

        p, t = pick(super().captured_work(batch)[last], 0)
        tokens, probs = [t], [p]
        for j in range(self.steps - 1):
            step = replace(one, input_ids=tokens[-1], positions=ins["step_pos"][j],
                           slot_mapping=ins["step_slots"][j], seq_lens=ins["step_lens"][j],
                           block_tables=batch.block_tables)
            p, t = pick(self.one.captured_work(step), j + 1)
            tokens.append(t)
            probs.append(p)
        return torch.stack((torch.stack(tokens, 1).float(), torch.stack(probs, 1)), dim=1)

    def _draw(self, ins: dict[str, torch.Tensor], hidden: torch.Tensor,
              step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled round's step: each row's draft drawn from its distribution (``distributions``
        with every filter run: the same numbers as a step-by-step round's, written into
        ``q_out``) by the inverse CDF of its uniform number for this step, with that
        distribution's top probability (not the drawn token's); greedy rows their argmax and its probability, as
        ``_argmax``. (probabilities, tokens)."""
        logits = self.model.compute_logits(hidden).float()
        q = distributions(logits, ins["sampling"], self.sampled)
        self.q_out[:q.shape[0], step].copy_(q)
        # (padding rows, and the blank inputs of the capture, have no distribution: kept in range)
        drawn = draw_rows(q, ins["uniforms"][step]).clamp_(max=logits.shape[-1] - 1)
        best_p, best = self._pick_greedy(logits)
        greedy = ins["sampling"][GREEDY] > 0
        # a drawn draft's confidence: its distribution's top probability (SecondModel.run_loop)
        return torch.where(greedy, best_p, q.amax(-1)), torch.where(greedy, best, drawn)

    def _argmax(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's greedy token and its probability (the draft's confidence)."""
        return self._pick_greedy(self.model.compute_logits(hidden))

    def _pick_greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(probability, token) of each row's argmax: one fused kernel where the device offers
        it, else softmax and max."""
        fused = getattr(self.fused_ops, "argmax_prob", None)
        return fused(logits) if fused is not None else logits.float().softmax(-1).max(-1)


def sampled_sizes(one: DecodeGraphs) -> list[int]:
    """The sizes of ``one`` that sampled loop graphs capture: those whose logits fit
    ``DraftLoopGraphs.SAMPLED_MAX_ELEMENTS``."""
    return [b for b in one.sizes if b * one.model.config.vocab_size <= DraftLoopGraphs.SAMPLED_MAX_ELEMENTS]


def chain_inputs(base: torch.Tensor, vrows: torch.Tensor, drows: torch.Tensor, best: torch.Tensor,
                 drafts: torch.Tensor, tables: torch.Tensor, block_size: int, out: dict[str, torch.Tensor]) -> None:
    """A chained round's inputs in torch (``deepinfer_kernels.chain_inputs`` does it in one kernel,
    with the same arguments): sequence i had ``base[i]`` tokens before the verified ones
    (negative: padding), its k + 1 target tokens are ``best[vrows[i]]`` and its k drafts
    ``drafts[drows[i]]``; the first step computes the target's token after the accepted drafts
    (behind the last draft when all were accepted: the draft's cache holds all but the last)."""
    k, bs, mb, q = drows.shape[1], block_size, tables.shape[1], out["ids"].shape[1]
    real = base >= 0
    best, drafts = best[vrows], drafts[drows]                            # [S, k + 1], [S, k]
    accepted = (best[:, :k] == drafts).long().cumprod(1).sum(1)
    target = best.gather(1, accepted[:, None])[:, 0]  # the target's token after the accepted drafts
    full = accepted == k
    new = 1 + full.long()  # one new token, or the last draft and the target's
    start = base + accepted - full.long()
    cols = torch.arange(q, device=base.device)[None, :]
    live = (cols < new[:, None]) & real[:, None]
    ids = torch.where(cols == 0, torch.where(full, drafts[:, k - 1], target)[:, None],
                      torch.where(full, target, 0)[:, None])
    pos = start[:, None] + torch.minimum(cols, new[:, None] - 1)  # padding rows repeat the last

    def slots(p: torch.Tensor) -> torch.Tensor:
        return tables.gather(1, (p // bs).clamp(0, mb - 1)).long() * bs + p % bs

    later = (start + new)[:, None] + torch.arange(k - 1, device=base.device)[None, :]  # [S, k - 1]
    for name, value in (("ids", torch.where(live, ids, 0)), ("pos", torch.where(real[:, None], pos, 0)),
                        ("slots", torch.where(live, slots(start[:, None] + cols), -1)),
                        ("lens", torch.where(real, start + new, 0)), ("ctx", torch.where(real, start, 0)),
                        ("single", (new == 1) & real), ("step_pos", torch.where(real[:, None], later, 0).T),
                        ("step_slots", torch.where(real[:, None], slots(later), -1).T),
                        ("step_lens", torch.where(real[:, None], later + 1, 0).T)):
        out[name].copy_(value)
