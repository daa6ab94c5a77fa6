"""Float conv2d for rlx-cpu: im2col plus one GEMM per group."""

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
        return _gemm(wmat, cols_view, out, None) or (lambda: np.matmul(wmat, cols_view, out=out))
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

    def pre() -> None:
        if inner is not None:
            np.copyto(inner, x)
        np.copyto(dst, src)

    def post() -> None:
        if res is not None:
            np.copyto(o, res)

    par = _gemm(wmat, cols, out, pre)
    if par is not None:
        def run_par() -> None:
            par()
            post()
        return run_par

    def run() -> None:
        pre()
        np.matmul(wmat, cols, out=out)
        post()
    return run


def _gemm(wmat: np.ndarray, cols: np.ndarray, out: np.ndarray, pre: Run | None) -> Run | None:
    """One group: ``out = W @ cols`` on the private BLAS, split over the pool by 16-column units of
    the (large) spatial axis; None where the private BLAS is unavailable or groups > 1."""
    from . import blas
    from .parallel import parts_for, pool

    if wmat.shape[0] != 1:
        return None
    gemm = blas.gemm_fn(wmat[0], cols[0], out[0])
    if gemm is None:
        return None
    og, k = wmat.shape[1:]
    p = out.shape[2]
    units = -(-p // 16)
    parts = parts_for(og * p * k // 64)

    def part(lo: int, hi: int) -> None:
        gemm(lo * 16, min(p, hi * 16), 1)

    rp = pool()

    def run() -> None:
        if pre is not None:
            pre()
        rp.run(part, units, (), parts)
    return run
