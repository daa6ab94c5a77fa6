"""Vectorisable float32 exp / tanh / sigmoid over chunks, for generated fused kernels.

Numba cannot vectorise calls into libm (scalar ``exp`` ~5 ns an element); these loops contain only
arithmetic, so LLVM turns them into AVX2 code (exp ~0.4 ns an element).

Accuracy (max relative error vs float64, measured over the float32 range): exp 8e-8;
tanh 3e-7; sigmoid 2e-7 — all within the conformance tolerances for float32 library functions.
exp flushes results below ~1.2e-38 (the denormal range) to 0; inf and NaN behave as IEEE.
Signature of every helper: ``f(x, out, ibuf, s1, s2)`` with chunk-sized scratch buffers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_FM = {"contract", "afn"}
_HI = np.float32(88.72283)
_LO = np.float32(-87.33654)


@njit(cache=True, nogil=True, inline="always")
def max_or_nan(row):
    """The maximum of a 1-D row, NaN if the row holds one (``max()`` alone skips NaN; a softmax must
    make such a row NaN, as the NumPy form's max-subtract does)."""
    m = row[0]
    nan = m != m
    for c in range(1, row.shape[0]):
        v = row[c]
        if v != v:
            nan = True
        elif v > m:
            m = v
    return np.nan if nan else m


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def vexp32(x, out, ibuf, s1, s2):
    n = x.shape[0]
    for i in range(n):
        v = x[i]
        vc = min(max(v, _LO), _HI)
        t = np.floor(vc * np.float32(1.4426950408889634) + np.float32(0.5))
        f = vc - t * np.float32(0.693359375) - t * np.float32(-2.12194440e-4)
        p = np.float32(1.9875691500e-4)
        p = p * f + np.float32(1.3981999507e-3)
        p = p * f + np.float32(8.3334519073e-3)
        p = p * f + np.float32(4.1665795894e-2)
        p = p * f + np.float32(1.6666665459e-1)
        p = p * f + np.float32(5.0000001201e-1)
        out[i] = (p * f * f + f) + np.float32(1.0)
        ibuf[i] = np.int32(t)
    # 2**t as two halves (t can be 128): build the float bits from the integer exponent.
    b1 = s1.view(np.int32)
    b2 = s2.view(np.int32)
    for i in range(n):
        t1 = ibuf[i] >> 1
        b1[i] = (t1 + 127) << 23
        b2[i] = (ibuf[i] - t1 + 127) << 23
    for i in range(n):
        v = x[i]
        r = out[i] * s1[i] * s2[i]
        r = np.float32(np.inf) if v > _HI else r
        r = np.float32(0.0) if v < _LO else r
        out[i] = v if v != v else r


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def vtanh32(x, out, ibuf, s1, s2):
    n = x.shape[0]
    arg = np.empty(n, np.float32)
    for i in range(n):
        arg[i] = np.float32(2.0) * abs(x[i])
    vexp32(arg, out, ibuf, s1, s2)
    for i in range(n):
        xv = x[i]
        av = abs(xv)
        x2 = xv * xv
        # Taylor series below 0.4 (no cancellation), 1 - 2/(e^2|x| + 1) above.
        small = xv * (np.float32(1.0) + x2 * (np.float32(-0.3333333333333333) + x2 * (
            np.float32(0.13333333333333333) + x2 * (np.float32(-0.05396825396825397) + x2 * (
                np.float32(0.021869488536155203) + x2 * np.float32(-0.008863235529902197))))))
        big = np.float32(1.0) - np.float32(2.0) / (out[i] + np.float32(1.0))
        big = big if xv >= 0 else -big
        r = small if av < np.float32(0.4) else big
        out[i] = xv if xv != xv else r


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def vsigmoid32(x, out, ibuf, s1, s2):
    n = x.shape[0]
    arg = np.empty(n, np.float32)
    for i in range(n):
        arg[i] = -x[i]
    vexp32(arg, out, ibuf, s1, s2)
    for i in range(n):
        out[i] = np.float32(1.0) / (np.float32(1.0) + out[i])
