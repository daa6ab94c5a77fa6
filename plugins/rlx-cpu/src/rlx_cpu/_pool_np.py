"""NumPy max pool on channel-blocked tensors: the contract of :func:`rlx_cpu._pool_nb.max_pool_blocked`
without Numba.

Why: a CNN whose only Numba kernel is its stem's max pool (ResNet-18 in a conv chain) loaded Numba,
SciPy and LLVM for it: ~117 MB of its peak RSS (libllvmlite's pages and LLVM's heap), more than
the model's weights. Here the pool is separable: a max over the kernel's rows first (strided rows
of whole contiguous image rows: long SIMD loops), then over its columns (one pixel's B lanes a
loop); on 2 cores within ~1.2x of the Numba kernel, faster at batch 1.
"""

from __future__ import annotations

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


def max_pool_blocked(x: np.ndarray, o: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int,
                     lo: int, hi: int) -> None:
    """Planes ``lo:hi`` of a max pool on channel-blocked tensors (x: (P, H, W, B), o: (P, HO, WO, B)).

    Padding never wins (taps outside the input are skipped; a window with none gives -inf) and NaN
    wins: ``np.maximum`` propagates a NaN from either side, as the Numba kernel's
    ``v if (v > m or v != v) else m`` does; the max of the same values is the same in any order."""
    h, w, nb = x.shape[1], x.shape[2], x.shape[3]
    ho, wo = o.shape[1], o.shape[2]
    rows = [(r0, r1, r0 * sh - pt + i) for i in range(kh) for r0, r1 in [_span(ho, h, sh, pt, i)] if r0 < r1]
    cols = [(c0, c1, c0 * sw - pl + j) for j in range(kw) for c0, c1 in [_span(wo, w, sw, pl, j)] if c0 < c1]
    step = max(1, CHUNK_BYTES // max(1, ho * w * nb * 4))
    buf = np.empty((min(step, max(hi - lo, 0)), ho, w, nb), np.float32)
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        xs, os_, t = x[a:b], o[a:b], buf[:b - a]
        t.fill(-np.inf)
        for r0, r1, ih in rows:
            d = t[:, r0:r1]
            np.maximum(d, xs[:, ih:ih + (r1 - r0 - 1) * sh + 1:sh], out=d)
        os_.fill(-np.inf)
        for c0, c1, iw in cols:
            d = os_[:, :, c0:c1]
            np.maximum(d, t[:, :, iw:iw + (c1 - c0 - 1) * sw + 1:sw], out=d)


def blocked_kernel() -> Callable[..., Any]:
    """The blocked max pool a conv chain binds: this module's, or the Numba one with
    ``RLX_CPU_POOL_NUMPY=0`` (imported only then: importing it loads Numba)."""
    from . import settings

    if settings.POOL_NUMPY.get():
        return max_pool_blocked
    from ._pool_nb import max_pool_blocked as numba_kernel

    return numba_kernel
