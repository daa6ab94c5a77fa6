"""Numba row kernels (compiled on first use, cached next to this file or in NUMBA_CACHE_DIR).

Serial by default: the GEMMs around these kernels already use every core through BLAS, and an
OpenMP pool spinning next to OpenBLAS's threads costs 10-30x on a 2-core machine. The ``*_par``
variants (for very large tensors) run with OMP_WAIT_POLICY=PASSIVE so idle threads sleep.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True, parallel=False, fastmath=False, error_model="numpy")
def softmax_rows(x, o):  # type: ignore[no-untyped-def]
    for r in range(x.shape[0]):
        m = x[r, 0]
        for c in range(1, x.shape[1]):
            if x[r, c] > m or x[r, c] != x[r, c]:
                m = x[r, c]
        s = 0.0
        for c in range(x.shape[1]):
            e = math.exp(x[r, c] - m)
            o[r, c] = e
            s += e
        inv = 1.0 / s
        for c in range(x.shape[1]):
            o[r, c] = o[r, c] * inv


@njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
def softmax_rows_par(x, o):  # type: ignore[no-untyped-def]
    for r in prange(x.shape[0]):
        m = x[r, 0]
        for c in range(1, x.shape[1]):
            if x[r, c] > m or x[r, c] != x[r, c]:
                m = x[r, c]
        s = 0.0
        for c in range(x.shape[1]):
            e = math.exp(x[r, c] - m)
            o[r, c] = e
            s += e
        inv = 1.0 / s
        for c in range(x.shape[1]):
            o[r, c] = o[r, c] * inv


@njit(cache=True, nogil=True, parallel=False, fastmath=False, error_model="numpy")
def log_softmax_rows(x, o):  # type: ignore[no-untyped-def]
    for r in range(x.shape[0]):
        m = x[r, 0]
        for c in range(1, x.shape[1]):
            if x[r, c] > m or x[r, c] != x[r, c]:
                m = x[r, c]
        s = 0.0
        for c in range(x.shape[1]):
            s += math.exp(x[r, c] - m)
        lse = m + math.log(s)
        for c in range(x.shape[1]):
            o[r, c] = x[r, c] - lse


@njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
def log_softmax_rows_par(x, o):  # type: ignore[no-untyped-def]
    for r in prange(x.shape[0]):
        m = x[r, 0]
        for c in range(1, x.shape[1]):
            if x[r, c] > m or x[r, c] != x[r, c]:
                m = x[r, c]
        s = 0.0
        for c in range(x.shape[1]):
            s += math.exp(x[r, c] - m)
        lse = m + math.log(s)
        for c in range(x.shape[1]):
            o[r, c] = x[r, c] - lse


@njit(cache=True, nogil=True, parallel=False, fastmath=False, error_model="numpy")
def layer_norm_rows(x, g, b, o, eps):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    for r in range(x.shape[0]):
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


@njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
def layer_norm_rows_par(x, g, b, o, eps):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    for r in prange(x.shape[0]):
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


__all__ = ["layer_norm_rows", "layer_norm_rows_par", "log_softmax_rows", "log_softmax_rows_par", "np",
           "softmax_rows", "softmax_rows_par"]
