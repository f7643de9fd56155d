"""The `triton` attention backend on a verification graph's layout (Q rows a sequence, padded)
gives each real row the bits of an eager mixed step: one-token runs through the decode kernel,
longer runs through the prefill kernel."""
from __future__ import annotations

import pytest
import torch

from deepinfer.core.step_batch import StepBatch
from deepinfer.plugins import AttentionLayerSpec
from deepinfer_builtin.attention.triton_attn import TritonAttention, TritonAttentionOptions
from tests.kernels.paged import i32, randn, random_paged_kv

HEADS, KV_HEADS, DIM, BS, SPLIT = 4, 2, 16, 4, 16


def _step(q_lens, starts, tables, device, q_per_seq=None, single_runs=None) -> StepBatch:
    """A step computing q_lens[i] tokens of sequence i from position starts[i]; with q_per_seq, in
    a graph's layout: every sequence owns q_per_seq rows, padded at its end (a sequence of 0 tokens
    is a padding sequence: length 0, no keys)."""
    rows = [q_per_seq or n for n in q_lens]
    qsl = [0]
    for n in rows:
        qsl.append(qsl[-1] + n)
    t = qsl[-1]
    return StepBatch(
        input_ids=torch.zeros(t, dtype=torch.long, device=device), positions=torch.zeros(t, dtype=torch.long, device=device),
        slot_mapping=torch.full((t,), -1, dtype=torch.long, device=device),  # the caches already hold the step's keys
        query_start_loc=i32(qsl, device), seq_lens=i32([s + n for s, n in zip(starts, q_lens)], device),
        context_lens=i32(starts, device), block_tables=tables, query_lens_cpu=tuple(rows),
        seq_lens_cpu=tuple(s + n for s, n in zip(starts, q_lens)), block_size=BS, max_query_len=max(rows),
        max_seq_len=64 if q_per_seq else max(s + n for s, n in zip(starts, q_lens)),
        single_runs=None if single_runs is None else torch.tensor(single_runs, device=device))


@pytest.mark.parametrize("window", [None, 9])
def test_verification_layout_gives_the_eager_steps_bits(window, device):
    attn = TritonAttention(TritonAttentionOptions(split_size=SPLIT), None)
    layer = AttentionLayerSpec(0, HEADS, KV_HEADS, DIM, sliding_window=window, scale=DIM ** -0.5)
    # one-token runs (not speculating) beside verifications of 3 and 4 tokens, Q = 4
    q_lens, starts, q = [1, 3, 1, 4], [37, 9, 20, 50], 4
    k_cache, v_cache, tables = random_paged_kv([s + n for s, n in zip(starts, q_lens)], BS, KV_HEADS, DIM,
                                               torch.float32, device)
    kv = torch.stack([k_cache, v_cache])
    real = randn(sum(q_lens), HEADS, DIM, dtype=torch.float32, device=device)
    # the graph holds one padding sequence more (a captured size above the batch); its rows and
    # the real sequences' padding rows are noise
    padded = randn((len(q_lens) + 1) * q, HEADS, DIM, dtype=torch.float32, device=device, seed=2)
    graph_tables = torch.cat([tables, torch.zeros_like(tables[:1])])
    graph_rows, at = [], 0
    for i, n in enumerate(q_lens):
        graph_rows += range(i * q, i * q + n)
        padded[i * q:i * q + n] = real[at:at + n]
        at += n

    def forward(batch, query):
        kv_new = torch.zeros(query.shape[0], KV_HEADS, DIM, device=device)  # slots -1: not written
        return attn.forward(layer, query, kv_new, kv_new, kv, attn.build_metadata(batch))

    eager = forward(_step(q_lens, starts, tables, device), real)
    flags = [n == 1 for n in q_lens] + [False]
    graph_lens, graph_starts = [*q_lens, 0], [*starts, 0]
    graph = forward(_step(graph_lens, graph_starts, graph_tables, device, q, flags), padded)
    assert torch.equal(graph[graph_rows], eager)
    # what the flags change: without them the one-token runs get the prefill kernel's numbers,
    # which differ in their last bits (so the equality above tells the two kernels apart)
    unflagged = forward(_step(graph_lens, graph_starts, graph_tables, device, q, [False] * len(flags)), padded)
    singles = [i * q for i, n in enumerate(q_lens) if n == 1]
    assert not torch.equal(unflagged[singles], graph[singles])
    torch.testing.assert_close(unflagged[singles], graph[singles], atol=1e-5, rtol=1e-5)
    longer = [r for r in graph_rows if r not in singles]
    assert torch.equal(unflagged[longer], graph[longer])
