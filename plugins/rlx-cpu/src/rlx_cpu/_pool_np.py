"""NumPy max pool on channel-blocked tensors: the contract of :func:`rlx_cpu._pool_nb.max_pool_blocked`
without Numba.

Why: a CNN whose only Numba kernel is its stem's max pool (ResNet-18 in a conv chain) loaded Numba,
SciPy and LLVM for it: ~117 MB of its peak RSS (libllvmlite's pages and LLVM's heap), more than
the model's weights. Here the pool is separable: a max over the kernel's rows first (strided rows
of whole contiguous image rows: long SIMD loops), then over its columns (one pixel's B lanes a
loop); on 2 cores within ~1.2x of the Numba kernel, faster at batch 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

#: Bytes of the row-max buffer a call works in at a time (planes are taken in groups this fits):
#: bounds the extra memory at large batches and keeps the buffer in cache between the two passes.
CHUNK_BYTES = 1 << 20


def _span(n_out: int, n_in: int, stride: int, pad: int, tap: int) -> tuple[int, int]:
    """Outputs ``a:b`` whose tap ``tap`` lands inside the input: ``0 <= o*stride - pad + tap < n_in``."""
    a = max(0, -(-(pad - tap) // stride))
    b = min(n_out, (n_in - 1 + pad - tap) // stride + 1)
    return a, b


@functools.lru_cache(maxsize=256)
def _taps(h: int, w: int, ho: int, wo: int, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int
          ) -> tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int], ...]]:
    """The row and column taps as ``(first output, end, first input)``, a tap covering every output
    first (it initialises the buffer by a copy instead of a fill and a max)."""
    rows = [(r0, r1, r0 * sh - pt + i) for i in range(kh) for r0, r1 in [_span(ho, h, sh, pt, i)] if r0 < r1]
    cols = [(c0, c1, c0 * sw - pl + j) for j in range(kw) for c0, c1 in [_span(wo, w, sw, pl, j)] if c0 < c1]
    rows.sort(key=lambda t: (t[0], -t[1]))
    cols.sort(key=lambda t: (t[0], -t[1]))
    return tuple(rows), tuple(cols)


def max_pool_blocked(x: np.ndarray, o: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int,
                     lo: int, hi: int) -> None:
    """Planes ``lo:hi`` of a max pool on channel-blocked tensors (x: (P, H, W, B), o: (P, HO, WO, B)).

    Padding never wins (taps outside the input are skipped; a window with none gives -inf) and NaN
    wins: ``np.maximum`` propagates a NaN from either side, as the Numba kernel's
    ``v if (v > m or v != v) else m`` does; the max of the same values is the same in any order."""
    h, w, nb = x.shape[1], x.shape[2], x.shape[3]
    ho, wo = o.shape[1], o.shape[2]
    rows, cols = _taps(h, w, ho, wo, kh, kw, sh, sw, pt, pl)
    # One row tap reading every input row in order (1-D pools run as (N, C, 1, L)): no row pass.
    direct = len(rows) == 1 and rows[0] == (0, ho, 0) and ho == h
    step = max(1, CHUNK_BYTES // max(1, ho * w * nb * 4))
    buf = None if direct else np.empty((min(step, max(hi - lo, 0)), ho, w, nb), np.float32)
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        xs, os_ = x[a:b], o[a:b]
        if buf is None:
            t = xs
        else:
            t = buf[:b - a]
            _pass(t, xs, rows, ho, sh, 1)
        _pass(os_, t, cols, wo, sw, 2)


def _pass(dst: np.ndarray, src: np.ndarray, taps: tuple[tuple[int, int, int], ...], n: int, stride: int,
          axis: int) -> None:
    """``dst`` = the max over ``taps`` of strided slices of ``src`` along ``axis`` (1: rows, 2: columns)."""
    start = 0
    if taps and taps[0][:2] == (0, n):  # the first tap covers every output: it initialises
        _, _, i = taps[0]
        np.copyto(dst, src[:, i:i + (n - 1) * stride + 1:stride] if axis == 1
                  else src[:, :, i:i + (n - 1) * stride + 1:stride])
        start = 1
    else:
        dst.fill(-np.inf)
    for k in range(start, len(taps)):
        a, b, i = taps[k]
        if axis == 1:
            d, s_ = dst[:, a:b], src[:, i:i + (b - a - 1) * stride + 1:stride]
        else:
            d, s_ = dst[:, :, a:b], src[:, :, i:i + (b - a - 1) * stride + 1:stride]
        np.maximum(d, s_, out=d)


def mean_blocked(x: np.ndarray, o: np.ndarray, c: int, lo: int, hi: int) -> None:
    """Images ``lo:hi`` of a global average pool on a chain's blocked buffer: the contract of
    :func:`rlx_cpu._se_nb.mean_blocked` (x: (N, CB, H, W, B), o: (N, c) float32, float64 sums)."""
    n, cb, h, w, b = x.shape
    s = np.add.reduce(x[lo:hi].reshape(hi - lo, cb, h * w, b), axis=2, dtype=np.float64)
    np.multiply(s.reshape(hi - lo, cb * b)[:, :c], 1.0 / (h * w), out=o[lo:hi], casting="same_kind")


def _numpy_pools() -> bool:
    import sys

    from . import settings

    return bool(settings.POOL_NUMPY.get()) and "numba" not in sys.modules


def mean_kernel() -> Callable[..., Any]:
    """The global average pool a conv chain ends with: as :func:`blocked_kernel` chooses."""
    if _numpy_pools():
        return mean_blocked
    from ._se_nb import mean_blocked as numba_kernel

    return numba_kernel


def blocked_kernel() -> Callable[..., Any]:
    """The blocked max pool a conv chain binds: this module's while Numba is not loaded, else (or
    with ``RLX_CPU_POOL_NUMPY=0``) the Numba one, 2-3x faster on small planes (a 1-D pool's
    (16, 1, 200, 16): 2.9 against 6.0 us) and free once another kernel has paid for Numba."""
    if _numpy_pools():
        return max_pool_blocked
    from ._pool_nb import max_pool_blocked as numba_kernel

    return numba_kernel
