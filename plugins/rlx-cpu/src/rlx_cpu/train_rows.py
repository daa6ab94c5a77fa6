"""Numba kernels for the small fused patterns of :mod:`rlx_cpu.train_fuse` (compiled on first use,
cached). Each replaces a chain of NumPy calls over a small tensor (a loss over 10 classes, a ReLU
mask) whose cost is the per-call overhead, not the arithmetic. Sums accumulate in float64; output
elements depend only on inputs at the same index (and row sums), so an output may be exactly one of
its inputs.
"""

from __future__ import annotations

import math

from numba import njit

_FM = {"contract", "nsz"}


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def log_softmax_backward(g, y, o):
    """``o = g - exp(y) * sum(g, axis=-1, keepdims=True)`` over 2-D rows."""
    rows, cols = g.shape
    for r in range(rows):
        s = 0.0
        for c in range(cols):
            s += g[r, c]
        for c in range(cols):
            o[r, c] = g[r, c] - math.exp(y[r, c]) * s


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def neg_mean_rowdot(a, b, o):
    """``o[()] = mean over rows of -sum(a * b, axis=-1)`` for 2-D ``a``, ``b``."""
    rows, cols = a.shape
    s = 0.0
    for r in range(rows):
        for c in range(cols):
            s += a[r, c] * b[r, c]
    o[0] = -s / rows


@njit(cache=True, nogil=True, error_model="numpy")
def one_hot(labels, o):
    """``o[r, c] = (labels[r] == c)`` (0 for a label out of range)."""
    rows, cols = o.shape
    for r in range(rows):
        v = labels[r]
        for c in range(cols):
            o[r, c] = 1 if v == c else 0


@njit(cache=True, nogil=True, error_model="numpy")
def relu_backward(x, v, o):
    """``o = where(x > 0, v, 0)`` over flat contiguous arrays."""
    for i in range(x.shape[0]):
        o[i] = v[i] if x[i] > 0 else 0


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def log_softmax(x, o):
    """``o = x - max - log(sum(exp(x - max)))`` over 2-D rows (``o`` may be ``x``)."""
    rows, cols = x.shape
    for r in range(rows):
        m = x[r, 0]
        for c in range(1, cols):
            v = x[r, c]
            if v > m or v != v:
                m = v
        s = 0.0
        for c in range(cols):
            s += math.exp(x[r, c] - m)
        ls = math.log(s)
        for c in range(cols):
            o[r, c] = (x[r, c] - m) - ls


@njit(cache=True, nogil=True, error_model="numpy")
def bias_relu(o, b):
    """``o = maximum(o + b, 0)`` in place over 2-D rows (NaN stays NaN, as ``np.maximum``)."""
    rows, cols = o.shape
    for r in range(rows):
        for c in range(cols):
            v = o[r, c] + b[c]
            o[r, c] = v if (v > 0 or v != v) else 0
