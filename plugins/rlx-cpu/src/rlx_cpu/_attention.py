"""Attention as one nogil Numba kernel over (batch, head, query-block) items.

Each item is two small GEMMs around an in-register softmax: ``s = (q*scale) @ k^T``, mask, softmax
with the vectorised exp, ``o = p @ v``. A query block has ``QBLOCK`` rows so every GEMM stays under
OpenBLAS's threading threshold (m*n*k <= 262144 at head size 32 and 128 keys): each call runs
single-threaded and the row pool, not BLAS, spreads the items over the cores. Scores live in a
per-call scratch block, so nothing of size (B, H, Sq, Sk) is ever materialised.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from .vecmath import max_or_nan, vexp32

QBLOCK = 64

MASK_NONE = 0
MASK_CAUSAL = 1
MASK_PADDING = 2
MASK_BIAS = 3


@njit(cache=True, nogil=True, error_model="numpy")
def vexp64(x, out, ibuf, s1, s2):
    for i in range(x.shape[0]):
        out[i] = np.exp(x[i])


def vexp_rows(x, out, ibuf, s1, s2):
    """exp of a row: the vectorised float32 helper, or libm for float64 (chosen at compile time)."""
    raise NotImplementedError("only callable from Numba-compiled code")


@overload(vexp_rows)
def _vexp_rows(x, out, ibuf, s1, s2):
    # Resolved by type while compiling, so the kernel stays cacheable on disk (a function passed
    # as an argument made Numba recompile attention in every process: ~3 s on the first run).
    if x.dtype == types.float32:
        return lambda x, out, ibuf, s1, s2: vexp32(x, out, ibuf, s1, s2)
    return lambda x, out, ibuf, s1, s2: vexp64(x, out, ibuf, s1, s2)


@njit(cache=True, nogil=True, inline="always")
def _rowmax(row):
    # Eight independent running maxima: one chain would wait out the latency of every compare.
    n = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
    j = 0
    while j + 8 <= n:
        m0 = max(m0, row[j])
        m1 = max(m1, row[j + 1])
        m2 = max(m2, row[j + 2])
        m3 = max(m3, row[j + 3])
        m4 = max(m4, row[j + 4])
        m5 = max(m5, row[j + 5])
        m6 = max(m6, row[j + 6])
        m7 = max(m7, row[j + 7])
        j += 8
    while j < n:
        m0 = max(m0, row[j])
        j += 1
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"}, error_model="numpy")
def attention_items(q, k, v, pad, bias, mode, scale, neg, o, lo, hi):
    bsz, h, sq, d = q.shape
    sk = k.shape[2]
    nblk = (sq + QBLOCK - 1) // QBLOCK
    # Scores and probabilities of a block as flat buffers: the exp runs once over the whole
    # block, not once a row (a call costs ~80 ns beyond its elements: with 17 keys that was
    # most of the softmax).
    sflat = np.empty(QBLOCK * sk, q.dtype)
    pflat = np.empty(QBLOCK * sk, q.dtype)
    qs = np.empty((QBLOCK, d), q.dtype)
    ib = np.empty(QBLOCK * sk, np.int32)
    s1 = np.empty(QBLOCK * sk, np.float32)
    s2 = np.empty(QBLOCK * sk, np.float32)
    inv = np.empty(QBLOCK, q.dtype)
    for it in range(lo, hi):
        b = it // (h * nblk)
        hh = (it // nblk) % h
        i0 = (it % nblk) * QBLOCK
        m = min(QBLOCK, sq - i0)
        for i in range(m):
            for c in range(d):
                qs[i, c] = q[b, hh, i0 + i, c] * scale
        sc = sflat[:m * sk].reshape((m, sk))
        pb = pflat[:m * sk].reshape((m, sk))
        np.dot(qs[:m], k[b, hh].T, sc)
        for i in range(m):
            row = sc[i]
            if mode == MASK_CAUSAL:
                for j in range(i0 + i + 1, sk):
                    row[j] = neg
            elif mode == MASK_PADDING:
                for j in range(sk):
                    if pad[b, j] == 0:  # (B, Sk) padding mask, nonzero = attend
                        row[j] = neg
            elif mode == MASK_BIAS:  # bias is broadcast to (B, H, Sq, Sk) (zero strides)
                for j in range(sk):
                    row[j] += bias[b, hh, i0 + i, j]
            mx = _rowmax(row)
            for j in range(sk):
                row[j] = row[j] - mx
        vexp_rows(sflat[:m * sk], pflat[:m * sk], ib, s1, s2)
        for i in range(m):
            e = pb[i]
            tot = 0.0
            for j in range(sk):
                tot += e[j]
            inv[i] = 1.0 / tot
        ob = o[b, hh, i0:i0 + m]
        np.dot(pb[:m], v[b, hh], ob)
        for i in range(m):
            for c in range(d):
                ob[i, c] *= inv[i]


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def guarded_items(q, kt, v, bias, c1, c2, o, lo, hi):
    """What exporters emit for torch's masked scaled_dot_product_attention, over (batch, head)
    items ``lo:hi``: ``p = softmax((q*c1) @ (kt*c2) + bias)``, NaN probabilities set to 0 (a
    fully masked row gives 0, not NaN), ``o = p @ v``. Loops, not BLAS: meant for the small heads
    (8 x 8) where a BLAS call costs more than its arithmetic. ``bias`` is broadcast to
    (B, H, Sq, Sk) (zero strides)."""
    bsz, h, sq, d = q.shape
    sk = kt.shape[3]
    dv = v.shape[3]
    qs = np.empty(d, q.dtype)
    ks = np.empty((d, sk), q.dtype)
    # An item's scores as one flat buffer: the exp runs once over all of them (vectorised), not
    # once an element through libm.
    sflat = np.empty(sq * sk, q.dtype)
    pflat = np.empty(sq * sk, q.dtype)
    ib = np.empty(sq * sk, np.int32)
    t1 = np.empty(sq * sk, np.float32)
    t2 = np.empty(sq * sk, np.float32)
    acc = np.empty(dv, q.dtype)
    for it in range(lo, hi):
        b = it // h
        hh = it % h
        for c in range(d):
            for j in range(sk):
                ks[c, j] = kt[b, hh, c, j] * c2  # the scaled keys, rounded as the graph does
        for i in range(sq):
            s = sflat[i * sk:(i + 1) * sk]
            for c in range(d):
                qs[c] = q[b, hh, i, c] * c1
            for j in range(sk):
                s[j] = 0.0
            for c in range(d):  # over the keys innermost: contiguous, vectorised
                qc = qs[c]
                for j in range(sk):
                    s[j] += qc * ks[c, j]
            for j in range(sk):
                s[j] += bias[b, hh, i, j]
            m = max_or_nan(s)
            for j in range(sk):
                s[j] = s[j] - m
        vexp_rows(sflat, pflat, ib, t1, t2)
        for i in range(sq):
            e = pflat[i * sk:(i + 1) * sk]
            tot = 0.0
            for j in range(sk):
                tot += e[j]
            inv = 1.0 / tot
            for j in range(sk):
                p = e[j] * inv
                e[j] = 0.0 if p != p else p  # the exporter's where(isnan(p), 0, p)
            for c in range(dv):
                acc[c] = 0.0
            for j in range(sk):  # rows of v, each contiguous
                ej = e[j]
                for c in range(dv):
                    acc[c] += ej * v[b, hh, j, c]
            for c in range(dv):
                o[b, hh, i, c] = acc[c]


#: Items :func:`guarded_across` carries through one pass (its buffers' innermost length).
ACROSS_ITEMS = 64


@njit(cache=True, nogil=True, inline="always")
def _gather_across(q, kt, v, c1, c2, qg, kg, vg, g0, g, h):
    """Items ``g0:g0+g`` of ``q * c1``, ``kt * c2`` (each rounded as the graph rounds it) and ``v``
    into buffers with the item innermost: ``qg[i, c, n]``, ``kg[c, j, n]``, ``vg[j, c, n]``."""
    sq, d = q.shape[2], q.shape[3]
    sk, dv = kt.shape[3], v.shape[3]
    for n in range(g):
        b = (g0 + n) // h
        hh = (g0 + n) % h
        for i in range(sq):
            for c in range(d):
                qg[i, c, n] = q[b, hh, i, c] * c1
        for c in range(d):
            for j in range(sk):
                kg[c, j, n] = kt[b, hh, c, j] * c2
        for j in range(sk):
            for c in range(dv):
                vg[j, c, n] = v[b, hh, j, c]


@njit(cache=True, nogil=True, fastmath={"contract"}, inline="always")
def _dot_across(qg, kg, i, j, acc, g):
    """``acc[n] = sum_c qg[i, c, n] * kg[c, j, n]`` for the first ``g`` items (over c in order)."""
    for n in range(g):
        acc[n] = 0.0
    for c in range(qg.shape[1]):
        qr = qg[i, c]
        kr = kg[c, j]
        for n in range(g):
            acc[n] += qr[n] * kr[n]


@njit(cache=True, nogil=True, fastmath={"contract"}, inline="always")
def _pv_across(eg, vg, og, i, g):
    """``og[i, c, n] = sum_j eg[i, j, n] * vg[j, c, n]`` for the first ``g`` items."""
    for c in range(vg.shape[1]):
        orow = og[i, c]
        for n in range(g):
            orow[n] = 0.0
        for j in range(eg.shape[1]):
            e = eg[i, j]
            vr = vg[j, c]
            for n in range(g):
                orow[n] += e[n] * vr[n]


@njit(cache=True, nogil=True, inline="always")
def _scatter_across(og, o, g0, g, h):
    for n in range(g):
        b = (g0 + n) // h
        hh = (g0 + n) % h
        for i in range(og.shape[0]):
            for c in range(og.shape[1]):
                o[b, hh, i, c] = og[i, c, n]


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def guarded_across(q, kt, v, bias, c1, c2, o, lo, hi):
    """:func:`guarded_items` for many tiny heads (8 x 8: decoders of the ONNX zoo at batch 8),
    with the items as the innermost axis of every buffer. Numba's LLVM vectorises only loops, and
    a loop of 8 keys runs in its scalar remainder (the SLP vectoriser is off in Numba); over up to
    :data:`ACROSS_ITEMS` items each step is one long contiguous loop (32 (batch, head) items of
    8 x 8: 29 -> 13-17 us). Same arithmetic as :func:`guarded_items`, in the same order per item."""
    bsz, h, sq, d = q.shape
    sk = kt.shape[3]
    dv = v.shape[3]
    dt = q.dtype
    gw = min(ACROSS_ITEMS, max(1, hi - lo))
    qg = np.empty((sq, d, gw), dt)
    kg = np.empty((d, sk, gw), dt)
    vg = np.empty((sk, dv, gw), dt)
    sg = np.empty((sq, sk, gw), dt)
    eg = np.empty((sq, sk, gw), dt)
    og = np.empty((sq, dv, gw), dt)
    acc = np.empty(gw, dt)
    mx = np.empty(gw, dt)
    nf = np.empty(gw, np.int32)
    tot = np.empty(gw, np.float64)
    bi = np.empty(gw, np.int64)
    hi_ = np.empty(gw, np.int64)
    nflat = sq * sk * gw
    ib = np.empty(nflat, np.int32)
    t1 = np.empty(nflat, np.float32)
    t2 = np.empty(nflat, np.float32)
    for g0 in range(lo, hi, gw):
        g = min(gw, hi - g0)
        _gather_across(q, kt, v, c1, c2, qg, kg, vg, g0, g, h)
        for n in range(g):
            bi[n] = (g0 + n) // h
            hi_[n] = (g0 + n) % h
        for i in range(sq):
            for j in range(sk):
                _dot_across(qg, kg, i, j, acc, g)
                row = sg[i, j]
                for n in range(g):
                    row[n] = acc[n] + bias[bi[n], hi_[n], i, j]
            for n in range(g):
                mx[n] = sg[i, 0, n]
                nf[n] = 0
            for j in range(sk):  # the row maximum; NaN anywhere in the row makes it NaN
                row = sg[i, j]
                for n in range(g):
                    x = row[n]
                    nf[n] |= x != x
                    mx[n] = x if x > mx[n] else mx[n]
            for n in range(g):
                if nf[n]:
                    mx[n] = np.nan
            for j in range(sk):
                row = sg[i, j]
                for n in range(g):
                    row[n] = row[n] - mx[n]
        vexp_rows(sg.reshape(nflat), eg.reshape(nflat), ib, t1, t2)
        for i in range(sq):
            for n in range(g):
                tot[n] = 0.0
            for j in range(sk):
                e = eg[i, j]
                for n in range(g):
                    tot[n] += e[n]
            for n in range(g):
                tot[n] = 1.0 / tot[n]
            for j in range(sk):
                e = eg[i, j]
                for n in range(g):
                    p = e[n] * tot[n]
                    e[n] = 0.0 if p != p else p  # the exporter's where(isnan(p), 0, p)
            _pv_across(eg, vg, og, i, g)
        _scatter_across(og, o, g0, g, h)


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def attention_across(q, kt, v, pad, bias, mode, scale, neg, o, lo, hi):
    """:func:`attention_items` for many tiny (batch, head) items, with the items innermost (see
    :func:`guarded_across`; ``kt``: the keys transposed, a view): item ``it`` writes
    ``o[it // H, it % H]`` whole."""
    bsz, h, sq, d = q.shape
    sk = kt.shape[3]
    dt = q.dtype
    gw = min(ACROSS_ITEMS, max(1, hi - lo))
    qg = np.empty((sq, d, gw), dt)
    kg = np.empty((d, sk, gw), dt)
    vg = np.empty((sk, d, gw), dt)
    sg = np.empty((sq, sk, gw), dt)
    eg = np.empty((sq, sk, gw), dt)
    og = np.empty((sq, d, gw), dt)
    acc = np.empty(gw, dt)
    mx = np.empty(gw, dt)
    tot = np.empty(gw, np.float64)
    inv = np.empty(gw, dt)
    bi = np.empty(gw, np.int64)
    hi_ = np.empty(gw, np.int64)
    nflat = sq * sk * gw
    ib = np.empty(nflat, np.int32)
    t1 = np.empty(nflat, np.float32)
    t2 = np.empty(nflat, np.float32)
    one = np.ones(1, dt)[0]  # scaling the keys by 1 is exact: the gather serves both kernels
    for g0 in range(lo, hi, gw):
        g = min(gw, hi - g0)
        _gather_across(q, kt, v, scale, one, qg, kg, vg, g0, g, h)
        for n in range(g):
            bi[n] = (g0 + n) // h
            hi_[n] = (g0 + n) % h
        for i in range(sq):
            for j in range(sk):
                _dot_across(qg, kg, i, j, acc, g)
                row = sg[i, j]
                for n in range(g):
                    row[n] = acc[n]
                if mode == MASK_CAUSAL:
                    if j > i:
                        for n in range(g):
                            row[n] = neg
                elif mode == MASK_PADDING:
                    for n in range(g):
                        if pad[bi[n], j] == 0:  # (B, Sk) padding mask, nonzero = attend
                            row[n] = neg
                elif mode == MASK_BIAS:
                    for n in range(g):
                        row[n] += bias[bi[n], hi_[n], i, j]
            for n in range(g):
                mx[n] = sg[i, 0, n]
            for j in range(1, sk):
                row = sg[i, j]
                for n in range(g):
                    mx[n] = max(mx[n], row[n])
            for j in range(sk):
                row = sg[i, j]
                for n in range(g):
                    row[n] = row[n] - mx[n]
        vexp_rows(sg.reshape(nflat), eg.reshape(nflat), ib, t1, t2)
        for i in range(sq):
            for n in range(g):
                tot[n] = 0.0
            for j in range(sk):
                e = eg[i, j]
                for n in range(g):
                    tot[n] += e[n]
            for n in range(g):
                inv[n] = 1.0 / tot[n]  # in the dtype, as attention_items scales its rows
            _pv_across(eg, vg, og, i, g)
            for c in range(d):
                orow = og[i, c]
                for n in range(g):
                    orow[n] *= inv[n]
        _scatter_across(og, o, g0, g, h)
