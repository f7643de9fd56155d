"""A whole decoder layer for one token in one kernel launch (batch-1 decode).

The single-token GEMVs (gemv.py) leave a layer at seven kernels: qkv, KV write, two attention
passes, o, gate/up, down. Each launch costs a few microseconds of ramp and drain in which the
memory system idles, and batch-1 decode is nothing but weight reads. Here one launch runs the
layer's stages as a dataflow:

1. Q   RMSNorm + qkv + Qwen3's q/k norm + rotary; k and v go straight into the paged cache;
2. A   attention: each kv head's keys cut into ``splits`` chunks, one program each, and the last
       chunk of a head to finish merges them (log-sum-exp) into the attention output;
3. O   o projection + residual add (in place);
4. G   RMSNorm + gate/up + SiLU-mul;
5. D   down projection + residual add (in place).

Every program first takes a ticket from an atomic counter, and the ticket, not its program id,
says which piece of which stage it computes: tickets go out in the order programs start, so a
program only ever waits for programs with smaller tickets, which are already running. That is
what makes waiting inside a kernel safe (no program waits for one that cannot be scheduled), in
the interpreter too (programs run one after another there, in ticket order). A program loads its
first weight tile, then waits for its stage's inputs (a counter reaching the producing stage's
program count), then computes and counts itself done: while the programs of one stage wait, the
weights of the next are already on the way. The last D program resets the counters.

Launches alternate between two sets of counters (``parity``): with programmatic dependent launch
the next layer's programs take their tickets while this layer finishes.

Rounding follows the GEMV kernels (the eager layers' points); attention sums its chunks in a fixed
order, but the chunks depend on the sequence's length only through ``splits``, so the output is
deterministic, though not bit-identical to the batched decode kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2, triton_interpreted
from deepinfer_kernels.gemv import _sm_count, counters, gemv_qkv_rotary_ref, gemv_ref
from deepinfer_kernels.kv_cache import write_kv_cache_ref
from deepinfer_kernels.paged_attention import LOG2E, paged_decode_attention_ref

# Counters (int32): 0 tickets, 1 D programs done, 2 Q programs done, 3 kv heads merged (A),
# 4 O programs done, 5 G programs done; 16 + g: chunks of kv head g done.


@kernel(do_not_specialize=["window", "stride_cp", "stride_cs", "stride_ch"])
def _decode_layer_kernel(
        res_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, nqkv_ptr, no_ptr, n1_ptr, n2_ptr, qn_ptr, kn_ptr,
        cos_ptr, sin_ptr, pos_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, table_ptr, seq_len_ptr,
        q_buf, part_o_ptr, part_lse_ptr, attn_buf, h_buf, cnt_ptr,
        eps, qk_eps, scale_log2, window, stride_cp, stride_cs, stride_ch,
        HID: tl.constexpr, HIDP: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
        HALF: tl.constexpr, INTER: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        QK_NORM: tl.constexpr, WINDOWED: tl.constexpr, IEEE: tl.constexpr,
        BQ: tl.constexpr, BKQ: tl.constexpr, BO: tl.constexpr, BKO: tl.constexpr,
        BG: tl.constexpr, BKG: tl.constexpr, BD: tl.constexpr, BKD: tl.constexpr,
        SPLITS: tl.constexpr, BLOCK_KEYS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
        NQ: tl.constexpr, NA: tl.constexpr, NO: tl.constexpr, NG: tl.constexpr, ND: tl.constexpr,
        NCNT: tl.constexpr, PF_CH: tl.constexpr, PF_AHEAD: tl.constexpr, PF_LANES: tl.constexpr,
        PF_NEXT: tl.constexpr, TICKETS: tl.constexpr, SPIN_LOADS: tl.constexpr, PDL: tl.constexpr):
    ty = res_ptr.dtype.element_ty
    if TICKETS:
        t = tl.atomic_add(cnt_ptr + 0, 1)
    else:  # the program id: relies on programs starting in id order
        t = tl.program_id(0)
    if PF_AHEAD > 0:
        # Ask the L2 for the weights PF_AHEAD elements ahead of where the programs now starting
        # read, in the order they read them: qkv, o, gate/up (row pairs), down, then the next
        # layer's qkv and o. The streaming goes on while a stage waits for the one before.
        lane = tl.arange(0, PF_LANES)
        pf = t.to(tl.int64) * PF_CH + PF_AHEAD + lane.to(tl.int64) * 64  # 64 elements: a 128-byte line
        e1 = (H + 2 * KVH) * D * HID
        e2 = e1 + HID * H * D
        e3 = e2 + 2 * INTER * HID
        e4 = e3 + HID * INTER
        og = pf - e2  # gate/up: row pair by row pair, as the G programs read them
        pair = og // (2 * HID)
        col = og % (2 * HID)
        gu = tl.where(col < HID, pair * HID + col, (INTER + pair) * HID + col - HID)
        ptr = tl.where(pf < e1, wqkv_ptr + pf, tl.where(pf < e2, wo_ptr + (pf - e1), tl.where(
            pf < e3, wgu_ptr + gu, tl.where(pf < e4, wd_ptr + (pf - e3), tl.where(
                pf < e4 + e1, nqkv_ptr + (pf - e4), no_ptr + (pf - e4 - e1))))))
        end = e4
        if PF_NEXT:
            end = e4 + e2
        ptr = tl.where((lane * 64 < PF_CH) & (pf < end), ptr, wqkv_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr], dtype=tl.int32,
                                  is_pure=False, pack=1)
    if t < NQ:
        # ---- Q: BQ rows of one head's first half and their partners HALF rows on --------------
        b = t
        n = tl.arange(0, BQ)
        hd = b // (HALF // BQ)  # the head (q heads, then k heads, then v heads)
        j = (b % (HALF // BQ)) * BQ + n
        r1 = hd * D + j
        w1_rows = wqkv_ptr + r1.to(tl.int64)[:, None] * HID
        w2_rows = wqkv_ptr + (r1 + HALF).to(tl.int64)[:, None] * HID
        kr = tl.arange(0, BKQ)
        w1 = tl.load(w1_rows + kr[None, :], mask=(kr < HID)[None, :], other=0.0)
        w2 = tl.load(w2_rows + kr[None, :], mask=(kr < HID)[None, :], other=0.0)
        if PDL:  # the residual is the previous kernel's (the last layer's, or the embedding)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        xs = tl.arange(0, HIDP)
        xf = tl.load(res_ptr + xs, mask=xs < HID, other=0.0, cache_modifier=".cg").to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 0) / HID + eps)
        y1 = tl.zeros([BQ], tl.float32)
        y2 = tl.zeros([BQ], tl.float32)
        for k0 in range(0, HID, BKQ):
            kk = k0 + kr
            km = kk < HID
            nk = kk + BKQ
            if HID > BKQ:  # the next tile, while this one is used (none when one tile holds K)
                w1n = tl.load(w1_rows + nk[None, :], mask=(nk < HID)[None, :], other=0.0)
                w2n = tl.load(w2_rows + nk[None, :], mask=(nk < HID)[None, :], other=0.0)
            else:
                w1n = w1
                w2n = w2
            xk = tl.load(res_ptr + kk, mask=km, other=0.0, cache_modifier=".cg").to(tl.float32)
            wn = tl.load(n1_ptr + kk, mask=km, other=0.0).to(tl.float32)
            xk = ((xk * inv).to(ty).to(tl.float32) * wn).to(ty).to(tl.float32)
            y1 += tl.sum(w1.to(tl.float32) * xk[None, :], 1)
            y2 += tl.sum(w2.to(tl.float32) * xk[None, :], 1)
            w1 = w1n
            w2 = w2n
        y1 = y1.to(ty).to(tl.float32)
        y2 = y2.to(ty).to(tl.float32)
        hv = tl.zeros([BQ], tl.int32) + hd  # broadcast: the interpreter rejects a scalar in a mask
        rot = hv < H + KVH
        if QK_NORM:  # BQ == HALF: the program holds the whole head
            hinv = tl.rsqrt((tl.sum(y1 * y1, 0) + tl.sum(y2 * y2, 0)) / D + qk_eps)
            is_q = hv < H
            g1 = tl.where(is_q, tl.load(qn_ptr + j).to(tl.float32), tl.load(kn_ptr + j).to(tl.float32))
            g2 = tl.where(is_q, tl.load(qn_ptr + HALF + j).to(tl.float32), tl.load(kn_ptr + HALF + j).to(tl.float32))
            y1 = tl.where(rot, ((y1 * hinv).to(ty).to(tl.float32) * g1).to(ty).to(tl.float32), y1)
            y2 = tl.where(rot, ((y2 * hinv).to(ty).to(tl.float32) * g2).to(ty).to(tl.float32), y2)
        p = tl.load(pos_ptr).to(tl.int64)
        c1 = tl.load(cos_ptr + p * stride_cp + j).to(tl.float32)
        c2 = tl.load(cos_ptr + p * stride_cp + HALF + j).to(tl.float32)
        s1 = tl.load(sin_ptr + p * stride_cp + j).to(tl.float32)
        s2 = tl.load(sin_ptr + p * stride_cp + HALF + j).to(tl.float32)
        o1 = tl.where(rot, (y1 * c1).to(ty).to(tl.float32) + (-y2 * s1).to(ty).to(tl.float32), y1)
        o2 = tl.where(rot, (y2 * c2).to(ty).to(tl.float32) + (y1 * s2).to(ty).to(tl.float32), y2)
        is_qv = hv < H
        tl.store(q_buf + hd * D + j, o1.to(ty), mask=is_qv)
        tl.store(q_buf + hd * D + HALF + j, o2.to(ty), mask=is_qv)
        slot = tl.load(slot_ptr).to(tl.int64)
        keep = (tl.zeros([BQ], tl.int64) + slot) >= 0  # a negative slot is never written
        is_k = keep & (hv >= H) & rot
        is_v = keep & (hv >= H + KVH)
        kd = k_cache_ptr.dtype.element_ty
        k_at = k_cache_ptr + slot * stride_cs + tl.maximum(hd - H, 0) * stride_ch + j
        v_at = v_cache_ptr + slot * stride_cs + tl.maximum(hd - H - KVH, 0) * stride_ch + j
        tl.store(k_at, o1.to(ty).to(kd), mask=is_k)
        tl.store(k_at + HALF, o2.to(ty).to(kd), mask=is_k)
        tl.store(v_at, o1.to(ty).to(kd), mask=is_v)
        tl.store(v_at + HALF, o2.to(ty).to(kd), mask=is_v)
        tl.debug_barrier()  # every warp's stores come before the release below
        tl.atomic_add(cnt_ptr + 2, 1, sem="release")
    if (t >= NQ) & (t < NQ + NA):
        # ---- A: one chunk of one kv head's keys, for the GROUP query heads that share it -------
        a = t - NQ
        g = a // SPLITS
        sj = a % SPLITS
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        seq_len = tl.load(seq_len_ptr)
        lo = 0
        if WINDOWED:
            lo = tl.maximum(seq_len - window, 0)
        base = (lo // BLOCK_KEYS) * BLOCK_KEYS
        tiles = (tl.maximum(seq_len - base, 0) + BLOCK_KEYS - 1) // BLOCK_KEYS
        per = (tiles + SPLITS - 1) // SPLITS * BLOCK_KEYS
        start = base + sj * per
        end = tl.minimum(start + per, seq_len)
        if SPIN_LOADS:  # plain reads while waiting, then one acquire, shared through a barrier
            done = tl.load(cnt_ptr + 2, volatile=True)
            while done < NQ:
                done = tl.load(cnt_ptr + 2, volatile=True)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + 2, 0, sem="acquire")
            tl.debug_barrier()
        else:
            done = tl.atomic_add(cnt_ptr + 2, 0, sem="acquire")  # read by one thread, shared with all
            while done < NQ:
                done = tl.atomic_add(cnt_ptr + 2, 0, sem="acquire")
        gi = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = g * GROUP + gi
        qm = (gi[:, None] < GROUP) & (d[None, :] < D)
        dot_ty = k_cache_ptr.dtype.element_ty
        q = tl.load(q_buf + heads[:, None] * D + d[None, :], mask=qm, other=0.0, cache_modifier=".cg").to(dot_ty)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_KEYS):
            pos = n0 + tl.arange(0, BLOCK_KEYS)
            valid = (pos >= lo) & (pos < end)
            blk = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
            slot_k = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
            kv_off = slot_k[:, None] * stride_cs + g * stride_ch + d[None, :]
            kv_mask = valid[:, None] & (d[None, :] < D)
            k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0, cache_modifier=".cg")
            v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0, cache_modifier=".cg")
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            pr = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            if IEEE:
                pv = tl.dot(pr, v, input_precision="ieee")
            else:
                pv = tl.dot(pr.to(dot_ty), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        has = l_i > 0.0
        part = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        cell = g * SPLITS + sj
        tl.store(part_o_ptr + (cell * BLOCK_G + gi[:, None]) * BLOCK_D + d[None, :], part)
        tl.store(part_lse_ptr + cell * BLOCK_G + gi, lse)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + 16 + g, 1, sem="acq_rel") == SPLITS - 1:
            # the head's last chunk: merge the chunks in order
            mx = tl.full([BLOCK_G], float("-inf"), tl.float32)
            for c in range(SPLITS):
                mx = tl.maximum(mx, tl.load(part_lse_ptr + (g * SPLITS + c) * BLOCK_G + gi, cache_modifier=".cg"))
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            out = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
            total = tl.zeros([BLOCK_G], tl.float32)
            for c in range(SPLITS):
                w = tl.exp2(tl.load(part_lse_ptr + (g * SPLITS + c) * BLOCK_G + gi, cache_modifier=".cg") - mx)
                o = tl.load(part_o_ptr + ((g * SPLITS + c) * BLOCK_G + gi[:, None]) * BLOCK_D + d[None, :],
                            cache_modifier=".cg")
                out += w[:, None] * o
                total += w
            out = out / tl.where(total > 0.0, total, 1.0)[:, None]
            tl.store(attn_buf + heads[:, None] * D + d[None, :], out.to(ty), mask=qm)
            tl.debug_barrier()
            tl.atomic_add(cnt_ptr + 3, 1, sem="release")
    if (t >= NQ + NA) & (t < NQ + NA + NO):
        # ---- O: BO rows of the o projection, added into the residual --------------------------
        b = t - NQ - NA
        n = tl.arange(0, BO)
        r = b * BO + n
        rows = wo_ptr + r.to(tl.int64)[:, None] * (H * D)
        kr = tl.arange(0, BKO)
        w = tl.load(rows + kr[None, :], mask=(kr < H * D)[None, :], other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if SPIN_LOADS:  # plain reads while waiting, then one acquire, shared through a barrier
            done = tl.load(cnt_ptr + 3, volatile=True)
            while done < KVH:
                done = tl.load(cnt_ptr + 3, volatile=True)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + 3, 0, sem="acquire")
            tl.debug_barrier()
        else:
            done = tl.atomic_add(cnt_ptr + 3, 0, sem="acquire")  # read by one thread, shared with all
            while done < KVH:
                done = tl.atomic_add(cnt_ptr + 3, 0, sem="acquire")
        y = tl.zeros([BO], tl.float32)
        for k0 in range(0, H * D, BKO):
            kk = k0 + kr
            nk = kk + BKO
            if H * D > BKO:
                wn = tl.load(rows + nk[None, :], mask=(nk < H * D)[None, :], other=0.0)
            else:
                wn = w
            xk = tl.load(attn_buf + kk, mask=kk < H * D, other=0.0, cache_modifier=".cg").to(tl.float32)
            y += tl.sum(w.to(tl.float32) * xk[None, :], 1)
            w = wn
        y = y.to(ty).to(tl.float32)
        old = tl.load(res_ptr + r, cache_modifier=".cg").to(tl.float32)
        tl.store(res_ptr + r, (y + old).to(ty))
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + 4, 1, sem="release")
    if (t >= NQ + NA + NO) & (t < NQ + NA + NO + NG):
        # ---- G: RMSNorm + BG gate rows and their up rows, SiLU-mul ----------------------------
        b = t - NQ - NA - NO
        n = tl.arange(0, BG)
        r = b * BG + n
        w1_rows = wgu_ptr + r.to(tl.int64)[:, None] * HID
        w2_rows = wgu_ptr + (r + INTER).to(tl.int64)[:, None] * HID
        kr = tl.arange(0, BKG)
        w1 = tl.load(w1_rows + kr[None, :], mask=(kr < HID)[None, :], other=0.0)
        w2 = tl.load(w2_rows + kr[None, :], mask=(kr < HID)[None, :], other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if SPIN_LOADS:  # plain reads while waiting, then one acquire, shared through a barrier
            done = tl.load(cnt_ptr + 4, volatile=True)
            while done < NO:
                done = tl.load(cnt_ptr + 4, volatile=True)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + 4, 0, sem="acquire")
            tl.debug_barrier()
        else:
            done = tl.atomic_add(cnt_ptr + 4, 0, sem="acquire")  # read by one thread, shared with all
            while done < NO:
                done = tl.atomic_add(cnt_ptr + 4, 0, sem="acquire")
        xs = tl.arange(0, HIDP)
        xf = tl.load(res_ptr + xs, mask=xs < HID, other=0.0, cache_modifier=".cg").to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 0) / HID + eps)
        y1 = tl.zeros([BG], tl.float32)
        y2 = tl.zeros([BG], tl.float32)
        for k0 in range(0, HID, BKG):
            kk = k0 + kr
            km = kk < HID
            nk = kk + BKG
            if HID > BKG:  # the next tile, while this one is used (none when one tile holds K)
                w1n = tl.load(w1_rows + nk[None, :], mask=(nk < HID)[None, :], other=0.0)
                w2n = tl.load(w2_rows + nk[None, :], mask=(nk < HID)[None, :], other=0.0)
            else:
                w1n = w1
                w2n = w2
            xk = tl.load(res_ptr + kk, mask=km, other=0.0, cache_modifier=".cg").to(tl.float32)
            wn = tl.load(n2_ptr + kk, mask=km, other=0.0).to(tl.float32)
            xk = ((xk * inv).to(ty).to(tl.float32) * wn).to(ty).to(tl.float32)
            y1 += tl.sum(w1.to(tl.float32) * xk[None, :], 1)
            y2 += tl.sum(w2.to(tl.float32) * xk[None, :], 1)
            w1 = w1n
            w2 = w2n
        y1 = y1.to(ty).to(tl.float32)
        y2 = y2.to(ty).to(tl.float32)
        act = (y1 / (1.0 + tl.exp(-y1))).to(ty).to(tl.float32)
        tl.store(h_buf + r, (act * y2).to(ty))
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + 5, 1, sem="release")
    if t >= NQ + NA + NO + NG:
        # ---- D: BD rows of the down projection, added into the residual -----------------------
        b = t - NQ - NA - NO - NG
        n = tl.arange(0, BD)
        r = b * BD + n
        rows = wd_ptr + r.to(tl.int64)[:, None] * INTER
        kr = tl.arange(0, BKD)
        w = tl.load(rows + kr[None, :], mask=(kr < INTER)[None, :], other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if SPIN_LOADS:  # plain reads while waiting, then one acquire, shared through a barrier
            done = tl.load(cnt_ptr + 5, volatile=True)
            while done < NG:
                done = tl.load(cnt_ptr + 5, volatile=True)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + 5, 0, sem="acquire")
            tl.debug_barrier()
        else:
            done = tl.atomic_add(cnt_ptr + 5, 0, sem="acquire")  # read by one thread, shared with all
            while done < NG:
                done = tl.atomic_add(cnt_ptr + 5, 0, sem="acquire")
        y = tl.zeros([BD], tl.float32)
        for k0 in range(0, INTER, BKD):
            kk = k0 + kr
            nk = kk + BKD
            if INTER > BKD:
                wn = tl.load(rows + nk[None, :], mask=(nk < INTER)[None, :], other=0.0)
            else:
                wn = w
            xk = tl.load(h_buf + kk, mask=kk < INTER, other=0.0, cache_modifier=".cg").to(tl.float32)
            y += tl.sum(w.to(tl.float32) * xk[None, :], 1)
            w = wn
        y = y.to(ty).to(tl.float32)
        old = tl.load(res_ptr + r, cache_modifier=".cg").to(tl.float32)
        tl.store(res_ptr + r, (y + old).to(ty))
        # the last D program leaves the counters zero for the launch after next: every other
        # program has counted itself done by then (D waited for G, G for O, O for A, A for Q)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel") == ND - 1:
            c = tl.arange(0, NCNT)
            tl.store(cnt_ptr + c, tl.zeros([NCNT], tl.int32), mask=c < 16 + KVH)


@dataclass(frozen=True)
class LayerConfig:
    """Tiles of the fused layer: (rows, columns a loop step) for the qkv pairs, o rows, gate/up
    pairs and down rows (the column step must divide K); ``splits``: attention chunks per kv
    head; ``block_keys``: keys a tile; ``num_warps`` for every program; ``l2_ahead_mb``: how far
    ahead of the programs' reads the weights are prefetched into the L2 (0: not at all; compiled
    CUDA only)."""

    qkv: tuple[int, int]
    o: tuple[int, int]
    gate_up: tuple[int, int]
    down: tuple[int, int]
    splits: int = 16
    block_keys: int = 32
    num_warps: int = 4
    l2_ahead_mb: float = 8.0
    tickets: bool = True
    spin_loads: bool = False


def default_layer_config(hidden: int, num_heads: int, head_dim: int, intermediate: int, qk_norm: bool,
                         device: torch.device) -> LayerConfig:
    """About 8,192 weights (16 KiB of bf16) a program and up to 2,048 columns a step, 4 warps;
    whole heads for the q/k norm. The interpreter gets small tiles (its programs are Python)."""
    cuda = device.type == "cuda"
    cap, widest = (8192, 2048) if cuda else (512, 64)

    def tile(rows: int, k: int, per_row: int) -> tuple[int, int]:
        bk = min(next_pow2(k), widest)
        live = per_row * (2 if k > bk else 1)  # a loop over K holds the next tile too
        bn = min(max(1, cap // (bk * live)), next_pow2(rows))
        while rows % bn:
            bn //= 2
        return bn, bk

    half = head_dim // 2
    qkv = (half, max(16, min(next_pow2(hidden), cap // (2 * half)))) if qk_norm else tile(half, hidden, 2)
    return LayerConfig(qkv, tile(hidden, num_heads * head_dim, 1), tile(intermediate, hidden, 2),
                       tile(hidden, intermediate, 1), splits=16 if cuda else 2, l2_ahead_mb=8.0 if cuda else 0.0)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as the fused kernel reads them (each [N, K], contiguous)."""

    qkv: torch.Tensor          # [(H + 2 KV) * D, hidden]
    o: torch.Tensor            # [hidden, H * D]
    gate_up: torch.Tensor      # [2 I, hidden] (gate rows, then up rows)
    down: torch.Tensor         # [hidden, I]
    input_norm: torch.Tensor   # [hidden]
    post_norm: torch.Tensor    # [hidden]
    eps: float
    q_norm: torch.Tensor | None = None  # [D] each (Qwen3)
    k_norm: torch.Tensor | None = None
    qk_eps: float = 1e-6


@dataclass(frozen=True)
class PagedKV:
    """The layer's paged cache for the step's one sequence: caches [num_slots, kv_heads, D], the
    new token's ``slot`` [1] (negative: not written), the sequence's ``block_table`` [max_blocks]
    and ``seq_len`` [1] (the new token included)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot: torch.Tensor
    block_table: torch.Tensor
    seq_len: torch.Tensor
    block_size: int
    scale: float
    sliding_window: int | None = None


def _check_layer(residual: torch.Tensor, w: LayerWeights, num_heads: int, num_kv_heads: int, head_dim: int,
                 cos: torch.Tensor, positions: torch.Tensor, kv: PagedKV) -> None:
    hid = residual.shape[-1]
    if residual.shape != (1, hid) or not residual.is_contiguous():
        raise ValueError(f"decode_layer takes the residual of one token, [1, hidden] contiguous; got "
                         f"{tuple(residual.shape)}")
    qkv_rows = (num_heads + 2 * num_kv_heads) * head_dim
    inter = w.down.shape[1] if w.down.dim() == 2 else -1
    want = {"qkv": (qkv_rows, hid), "o": (hid, num_heads * head_dim), "gate_up": (2 * inter, hid),
            "down": (hid, inter), "input_norm": (hid,), "post_norm": (hid,)}
    for name, shape in want.items():
        t = getattr(w, name)
        if tuple(t.shape) != shape or t.dtype != residual.dtype or t.device != residual.device \
                or not t.is_contiguous():
            raise ValueError(f"decode_layer: weight {name} must be a contiguous {residual.dtype} {shape} on "
                             f"{residual.device}; got {t.dtype} {tuple(t.shape)} on {t.device}")
    if (w.q_norm is None) != (w.k_norm is None):
        raise ValueError("decode_layer: q_norm and k_norm must both be given or both be None")
    half = head_dim // 2
    if head_dim % 2 or (w.q_norm is not None and half & (half - 1)):
        raise ValueError(f"decode_layer needs an even head_dim (a power-of-two half with q/k norm); got {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if cos.dim() != 2 or cos.shape[1] != head_dim or cos.stride(1) != 1 or positions.shape != (1,):
        raise ValueError(f"decode_layer takes cos/sin tables [max_positions, {head_dim}] and one position; "
                         f"got {tuple(cos.shape)} and {tuple(positions.shape)}")
    kc = kv.k_cache
    if kc.dim() != 3 or kc.shape[1:] != (num_kv_heads, head_dim) or kv.v_cache.shape != kc.shape \
            or kc.stride(-1) != 1 or kv.v_cache.stride() != kc.stride():
        raise ValueError(f"decode_layer: caches {tuple(kc.shape)} / {tuple(kv.v_cache.shape)} must be "
                         f"[num_slots, {num_kv_heads}, {head_dim}] with equal strides, the last contiguous")
    if kv.slot.shape != (1,) or kv.seq_len.shape != (1,) or kv.block_table.dim() != 1 \
            or kv.block_table.stride(0) != 1:
        raise ValueError("decode_layer takes slot [1], seq_len [1] and one contiguous block_table row")


def decode_layer(residual: torch.Tensor, weights: LayerWeights, num_heads: int, num_kv_heads: int,
                 cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, kv: PagedKV, *,
                 parity: int = 0, config: LayerConfig | None = None, pdl: bool = False,
                 next_weights: LayerWeights | None = None) -> torch.Tensor:
    """One decoder layer for one token, in place: ``residual`` [1, hidden] goes in as the layer's
    input and comes out as its output; the token's key and value are written to ``kv``'s caches at
    its slot. ``parity``: alternate 0 and 1 between consecutive launches (the layer index does).
    ``pdl``: launch with programmatic dependent launch (see gemv.pdl_supported). ``next_weights``:
    the next layer's (same shapes), whose first weights this launch prefetches into the L2."""
    head_dim = cos.shape[-1] if cos.dim() == 2 else 0
    _check_layer(residual, weights, num_heads, num_kv_heads, head_dim, cos, positions, kv)
    hid = residual.shape[1]
    inter = weights.down.shape[1]
    half = head_dim // 2
    cfg = config or default_layer_config(hid, num_heads, head_dim, inter, weights.q_norm is not None,
                                         residual.device)
    (bq, bkq), (bo, bko), (bg, bkg), (bd, bkd) = cfg.qkv, cfg.o, cfg.gate_up, cfg.down
    if half % bq or (weights.q_norm is not None and bq != half) or hid % bo or inter % bg or hid % bd:
        raise ValueError(f"decode_layer: tiles {cfg} do not fit hidden {hid}, intermediate {inter}, half head "
                         f"{half} (row counts must divide them; whole heads with q/k norm)")
    group = num_heads // num_kv_heads
    block_g, block_d = max(16, next_pow2(group)), max(16, next_pow2(head_dim))
    dev = residual.device
    nq = (num_heads + 2 * num_kv_heads) * half // bq
    na = num_kv_heads * cfg.splits
    no, ng, nd = hid // bo, inter // bg, hid // bd
    q_buf = torch.empty(num_heads * head_dim, dtype=residual.dtype, device=dev)
    attn = torch.empty(num_heads * head_dim, dtype=residual.dtype, device=dev)
    h_buf = torch.empty(inter, dtype=residual.dtype, device=dev)
    part_o = torch.empty(na * block_g * block_d, dtype=torch.float32, device=dev)
    part_lse = torch.empty(na * block_g, dtype=torch.float32, device=dev)
    cnt = counters(dev, 16 + num_kv_heads, f"decode_layer{parity % 2}")
    total = nq + na + no + ng + nd
    weights_total = sum(w.numel() for w in (weights.qkv, weights.o, weights.gate_up, weights.down))
    ahead = int(cfg.l2_ahead_mb * 2**20) // residual.element_size()
    if triton_interpreted():
        ahead = 0  # the interpreter has no inline assembly
    chunk = -(-weights_total // total)
    chunk = -(-chunk // 64) * 64
    nxt = next_weights if next_weights is not None and next_weights.qkv.shape == weights.qkv.shape \
        and next_weights.o.shape == weights.o.shape else None
    qn = weights.q_norm if weights.q_norm is not None else weights.input_norm
    kn = weights.k_norm if weights.k_norm is not None else weights.input_norm
    _decode_layer_kernel[(total,)](
        residual, weights.qkv, weights.o, weights.gate_up, weights.down,
        (nxt or weights).qkv, (nxt or weights).o, weights.input_norm, weights.post_norm,
        qn, kn, cos, sin, positions, kv.k_cache, kv.v_cache, kv.slot, kv.block_table, kv.seq_len,
        q_buf, part_o, part_lse, attn, h_buf, cnt,
        weights.eps, weights.qk_eps, kv.scale * LOG2E, kv.sliding_window or 0, cos.stride(0),
        kv.k_cache.stride(0), kv.k_cache.stride(1),
        HID=hid, HIDP=next_pow2(hid), H=num_heads, KVH=num_kv_heads, D=head_dim, HALF=half, INTER=inter,
        GROUP=group, BLOCK_SIZE=kv.block_size, QK_NORM=weights.q_norm is not None,
        WINDOWED=kv.sliding_window is not None, IEEE=kv.k_cache.dtype == torch.float32,
        BQ=bq, BKQ=bkq, BO=bo, BKO=bko, BG=bg, BKG=bkg, BD=bd, BKD=bkd,
        SPLITS=cfg.splits, BLOCK_KEYS=cfg.block_keys, BLOCK_G=block_g, BLOCK_D=block_d,
        NQ=nq, NA=na, NO=no, NG=ng, ND=nd, NCNT=next_pow2(16 + num_kv_heads), PF_CH=chunk, PF_AHEAD=ahead,
        PF_LANES=next_pow2(chunk // 64), PF_NEXT=nxt is not None, TICKETS=cfg.tickets,
        SPIN_LOADS=cfg.spin_loads, PDL=pdl, num_warps=cfg.num_warps)
    return residual


def decode_layer_ref(residual: torch.Tensor, weights: LayerWeights, num_heads: int, num_kv_heads: int,
                     cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, kv: PagedKV, *,
                     parity: int = 0, config: LayerConfig | None = None, pdl: bool = False,
                     next_weights: LayerWeights | None = None) -> torch.Tensor:
    """Torch reference of :func:`decode_layer` (the GEMV references and float32 attention)."""
    w = weights
    d = cos.shape[-1]
    qkv = gemv_qkv_rotary_ref(residual, w.qkv, w.input_norm, w.eps, cos, sin, positions, num_heads, num_kv_heads,
                              w.q_norm, w.k_norm, w.qk_eps)
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    write_kv_cache_ref(k.view(1, num_kv_heads, d), v.view(1, num_kv_heads, d), kv.k_cache, kv.v_cache, kv.slot)
    attn = paged_decode_attention_ref(q.view(1, num_heads, d), kv.k_cache, kv.v_cache, kv.block_table[None],
                                      kv.seq_len, kv.block_size, kv.scale, kv.sliding_window)
    gemv_ref(attn.reshape(1, -1), w.o, residual=residual)
    act = gemv_ref(residual, w.gate_up, norm_weight=w.post_norm, eps=w.eps, silu_mul=True)
    gemv_ref(act, w.down, residual=residual)
    return residual


__all__ = ["LayerConfig", "LayerWeights", "PagedKV", "decode_layer", "decode_layer_ref", "default_layer_config"]
