"""The `torch` attention backend's batch-invariant attention (``--batch-invariant``).

A query row's output must not depend on what else the step holds: other sequences, other query
rows of its own sequence (a prefill against a decode, a chunk boundary, a verification's drafts),
or how many keys the step gathered. Batched matmuls and softmaxes over the padded batch depend on
all three (the matmul's kernel and blocking follow the shapes; a row's softmax sums as many
elements as the longest sequence has keys). Here every product is a matmul of one fixed shape:
queries in tiles of ``QUERY_TILE`` rows (a kv head's query heads, token by token, zero-padded), keys
in chunks of ``KEY_CHUNK`` positions counted from the sequence's first key, and the softmax runs
over the chunks in order, online, in float32 (as flash attention does on GPUs). A chunk a row
cannot see adds exact zeros and leaves its running maximum as it was, so a row's result depends
only on its own query, the keys it sees and where they sit.
"""
from __future__ import annotations

import torch

#: rows (query heads of one kv head, token by token) per matmul
QUERY_TILE = 16
#: key positions per step of the online softmax
KEY_CHUNK = 64


def attend_invariant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """Attention of q [B, T, H, D] over k [B, n, kvh, D] and v [B, n, kvh, Dv] (mask [B or 1, 1, T, n],
    True: attend; None: every key), key i at position i of its sequence: [B, T, H, Dv] in q's dtype.
    A row that sees no key gets zeros."""
    b, t, h, d = q.shape
    n, kvh, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // kvh
    rows = t * g
    tiles = max(1, -(-rows // QUERY_TILE))
    chunks = max(1, -(-n // KEY_CHUNK))
    # queries: [B * kvh * tiles, QUERY_TILE, D], a kv head's query heads token by token
    qg = q.float().view(b, t, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, rows, d)
    qp = qg.new_zeros(b, kvh, tiles * QUERY_TILE, d)
    qp[:, :, :rows] = qg
    qp = qp.view(-1, QUERY_TILE, d)
    # keys and values: [B, kvh, chunks * KEY_CHUNK, D], zeros past the gathered ones
    kp = k.new_zeros(b, kvh, chunks * KEY_CHUNK, d, dtype=torch.float32)
    vp = v.new_zeros(b, kvh, chunks * KEY_CHUNK, dv, dtype=torch.float32)
    kp[:, :, :n] = k.float().permute(0, 2, 1, 3)
    vp[:, :, :n] = v.float().permute(0, 2, 1, 3)
    # what each row sees: [B, 1, tiles * QUERY_TILE, chunks * KEY_CHUNK] (a kv head's rows alike)
    seen = torch.zeros(b, 1, tiles * QUERY_TILE, chunks * KEY_CHUNK, dtype=torch.bool, device=q.device)
    if mask is None:
        seen[:, :, :rows, :n] = True
    else:
        seen[:, :, :rows, :n] = mask.expand(b, 1, t, n)[:, :, :, None].expand(b, 1, t, g, n).reshape(b, 1, rows, n)
    seen = seen.expand(b, kvh, -1, -1).reshape(-1, QUERY_TILE, chunks * KEY_CHUNK)

    def per_tile(x: torch.Tensor) -> torch.Tensor:  # [B, kvh, C, X] -> [B * kvh * tiles, C, X]
        return x[:, :, None].expand(b, kvh, tiles, *x.shape[2:]).reshape(-1, *x.shape[2:])

    m = torch.full((qp.shape[0], QUERY_TILE), float("-inf"), device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(qp.shape[0], QUERY_TILE, dv, device=q.device)
    for c in range(chunks):
        cols = slice(c * KEY_CHUNK, (c + 1) * KEY_CHUNK)
        s = torch.bmm(qp, per_tile(kp[:, :, cols]).transpose(1, 2)) * scale
        s = s.masked_fill(~seen[:, :, cols], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.bmm(p, per_tile(vp[:, :, cols]))
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0)[..., None]
    out = out.view(b, kvh, tiles * QUERY_TILE, dv)[:, :, :rows]
    return out.reshape(b, kvh, t, g, dv).permute(0, 2, 1, 3, 4).reshape(b, t, h, dv).to(q.dtype)
