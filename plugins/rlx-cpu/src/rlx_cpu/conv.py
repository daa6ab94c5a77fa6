"""Float conv2d for rlx-cpu: im2col plus one GEMM per group (NumPy's threaded BLAS: with few output
channels a thread, splitting the spatial axis over the row pool measured no faster)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Run = Callable[[], None]


def conv2d_float(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                  pads: tuple[int, int, int, int], dil: tuple[int, int], g: int) -> Run:
    """im2col in (C*KH*KW, N*HO*WO) order, then one GEMM per group ``W @ cols``.

    That order makes the gather copy whole output rows (contiguous along WO) and, at batch 1,
    makes the GEMM's (O, HO*WO) result the NCHW output itself: no transpose afterwards. A 1x1,
    stride-1, unpadded conv at batch 1 needs no im2col at all. Scratch is allocated at bind time.
    """
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
    n, c, h, wd = x.shape
    oc, ci, kh, kw = w.shape
    _, _, ho, wo = o.shape
    og, kk, p = oc // g, ci * kh * kw, n * ho * wo
    wmat = np.ascontiguousarray(w.reshape(g, og, kk))
    out = o.reshape(g, og, p) if n == 1 else np.empty((g, og, p), o.dtype)
    if kh == kw == 1 and sh == sw == 1 and not any(pads) and n == 1:
        cols_view = x.reshape(g, ci, h * wd)
        return lambda: np.matmul(wmat, cols_view, out=out)
    if any(pads):
        padded = np.zeros((n, c, h + pt + pb, wd + pl + pr), x.dtype)
        inner = padded[:, :, pt:pt + h, pl:pl + wd]
    else:
        padded, inner = x, None
    win = np.lib.stride_tricks.sliding_window_view(padded, (dh * (kh - 1) + 1, dw * (kw - 1) + 1),
                                                   axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]  # n, c, ho, wo, kh, kw
    src = win.transpose(1, 4, 5, 0, 2, 3)  # c, kh, kw, n, ho, wo
    cols = np.empty((g, kk, p), x.dtype)
    dst = cols.reshape(c, kh, kw, n, ho, wo)
    res = None if n == 1 else out.reshape(g, og, n, ho, wo).transpose(2, 0, 1, 3, 4).reshape(n, oc, ho, wo)
    assert res is None or np.shares_memory(res, out)  # a view, so each run sees the new GEMM result

    def run() -> None:
        if inner is not None:
            np.copyto(inner, x)
        np.copyto(dst, src)
        np.matmul(wmat, cols, out=out)
        if res is not None:
            np.copyto(o, res)
    return run
