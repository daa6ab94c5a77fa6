"""Numba row kernels (compiled on first use, cached next to this file or in NUMBA_CACHE_DIR).

Serial on purpose: the GEMMs around these kernels already use every core through BLAS, and an
OpenMP pool spinning next to OpenBLAS's threads cost 10-30x on a 2-core machine. Softmax is not
here: NumPy's SIMD exp over four passes beat a scalar Numba row loop (measured 0.39 vs 0.99 ms).
"""

from __future__ import annotations

import math

from numba import njit


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
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
