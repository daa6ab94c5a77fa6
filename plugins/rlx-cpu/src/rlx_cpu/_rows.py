"""Numba row kernels over rows ``lo:hi`` (compiled on first use, cached next to this file or in
NUMBA_CACHE_DIR); :mod:`rlx_cpu.parallel` splits the rows over the cores. Reassociation lets the
row sums vectorise; it reorders, never drops, NaN and Inf.
"""

from __future__ import annotations

import math

from numba import njit


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
