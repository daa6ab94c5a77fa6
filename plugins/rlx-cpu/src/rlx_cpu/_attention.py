"""Attention as one nogil Numba kernel over (batch, head, query-block) items.

Each item is two small GEMMs around an in-register softmax: ``s = (q*scale) @ k^T``, mask, softmax
with the vectorised exp, ``o = p @ v``. A query block has ``QBLOCK`` rows so every GEMM stays under
OpenBLAS's threading threshold (m*n*k <= 262144 at head size 32 and 128 keys): each call runs
single-threaded and the row pool, not BLAS, spreads the items over the cores. Scores live in a
per-call scratch block, so nothing of size (B, H, Sq, Sk) is ever materialised. ``expfn`` is
:func:`rlx_cpu.vecmath.vexp32` for float32 and :func:`vexp64` for float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

QBLOCK = 64

MASK_NONE = 0
MASK_CAUSAL = 1
MASK_PADDING = 2


@njit(cache=True, nogil=True, error_model="numpy")
def vexp64(x, out, ibuf, s1, s2):  # type: ignore[no-untyped-def]
    for i in range(x.shape[0]):
        out[i] = np.exp(x[i])


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"}, error_model="numpy")
def attention_items(q, k, v, keep, mode, scale, neg, expfn, o, lo, hi):  # type: ignore[no-untyped-def]
    bsz, h, sq, d = q.shape
    sk = k.shape[2]
    nblk = (sq + QBLOCK - 1) // QBLOCK
    s = np.empty((QBLOCK, sk), q.dtype)
    qs = np.empty((QBLOCK, d), q.dtype)
    e = np.empty(sk, q.dtype)
    ib = np.empty(sk, np.int32)
    s1 = np.empty(sk, np.float32)
    s2 = np.empty(sk, np.float32)
    inv = np.empty(QBLOCK, q.dtype)
    for it in range(lo, hi):
        b = it // (h * nblk)
        hh = (it // nblk) % h
        i0 = (it % nblk) * QBLOCK
        m = min(QBLOCK, sq - i0)
        for i in range(m):
            for c in range(d):
                qs[i, c] = q[b, hh, i0 + i, c] * scale
        sc = s[:m]
        np.dot(qs[:m], k[b, hh].T, sc)
        for i in range(m):
            row = sc[i]
            if mode == MASK_CAUSAL:
                for j in range(i0 + i + 1, sk):
                    row[j] = neg
            elif mode == MASK_PADDING:
                for j in range(sk):
                    if keep[b, j] == 0:
                        row[j] = neg
            mx = row[0]
            for j in range(1, sk):
                mx = max(mx, row[j])
            for j in range(sk):
                row[j] = row[j] - mx
            expfn(row, e, ib, s1, s2)
            tot = 0.0
            for j in range(sk):
                row[j] = e[j]
                tot += e[j]
            inv[i] = 1.0 / tot
        ob = o[b, hh, i0:i0 + m]
        np.dot(sc, v[b, hh], ob)
        for i in range(m):
            for c in range(d):
                ob[i, c] *= inv[i]
