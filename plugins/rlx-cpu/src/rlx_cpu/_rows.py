"""Numba row kernels over rows ``lo:hi`` (compiled on first use, cached next to this file or in
NUMBA_CACHE_DIR); :mod:`rlx_cpu.parallel` splits the rows over the cores. Reassociation lets the
row sums vectorise; it reorders, never drops, NaN and Inf.
"""

from __future__ import annotations

import math

from numba import njit

from .vecmath import max_or_nan, vexp32


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"}, error_model="numpy")
def layer_norm_rows(x, g, b, o, eps, lo, hi):
    n = x.shape[1]
    for r in range(lo, hi):
        s = 0.0
        for c in range(n):
            s += x[r, c]
        mu = s / n
        v = 0.0
        for c in range(n):
            d = x[r, c] - mu
            v += d * d
        inv = 1.0 / math.sqrt(v / n + eps)
        for c in range(n):
            o[r, c] = (x[r, c] - mu) * inv * g[c] + b[c]


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"}, error_model="numpy")
def rms_norm_rows(x, g, o, eps, lo, hi):
    n = x.shape[1]
    for r in range(lo, hi):
        v = 0.0
        for c in range(n):
            a = float(x[r, c])  # squares summed in float64, like the layer_norm rows
            v += a * a
        inv = 1.0 / math.sqrt(v / n + eps)
        for c in range(n):
            o[r, c] = x[r, c] * inv * g[c]


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def softmax_rows(x, o, log, lo, hi):
    # softmax (log=False) or log_softmax over rows; a NaN or +inf in a row makes the whole row NaN,
    # as the NumPy form's max-subtract does (max() alone would skip a NaN).
    n = x.shape[1]
    for r in range(lo, hi):
        m = max_or_nan(x[r])
        s = 0.0
        if log:
            for c in range(n):
                s += math.exp(x[r, c] - m)
            ls = math.log(s)
            for c in range(n):
                o[r, c] = (x[r, c] - m) - ls
        else:
            for c in range(n):
                e = math.exp(x[r, c] - m)
                o[r, c] = e
                s += e
            inv = 1.0 / s
            for c in range(n):
                o[r, c] = o[r, c] * inv


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def softmax_rows_f32(x, o, t, ib, s1, s2, lo, hi):
    """:func:`softmax_rows` (log=False) for float32 with the exp vectorised over all the rows at once
    (``t``, ``ib``, ``s1``, ``s2``: scratch of ``(hi - lo) * n`` elements): a libm exp an element
    was most of a short-row softmax (256 rows of 8: 18 -> 3.7 us)."""
    n = x.shape[1]
    k = (hi - lo) * n
    for r in range(lo, hi):
        m = max_or_nan(x[r])
        base = (r - lo) * n
        for c in range(n):
            t[base + c] = x[r, c] - m
    vexp32(t[:k], o[lo:hi].reshape(k), ib[:k], s1[:k], s2[:k])
    for r in range(lo, hi):
        s = 0.0
        for c in range(n):
            s += o[r, c]
        inv = 1.0 / s
        for c in range(n):
            o[r, c] = o[r, c] * inv
