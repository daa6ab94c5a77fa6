"""Float conv2d for rlx-cpu: im2col plus one GEMM per group (NumPy's threaded BLAS: with few output
channels a thread, splitting the spatial axis over the row pool measured no faster)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

Run = Callable[[], None]


_TLS = threading.local()


def scratch(nbytes: int) -> np.ndarray:
    """This thread's scratch bytes, grown on demand and shared by every conv that runs on it: the
    convs of a program run one after another, so one im2col buffer serves them all (a buffer per
    conv cost 1.1 GB of RSS for ResNet-18 at batch 8)."""
    buf = getattr(_TLS, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1), np.uint8)
        _TLS.buf = buf
    return buf


def _align(n: int) -> int:
    return -(-n // 64) * 64


def conv2d_float(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                 pads: tuple[int, int, int, int], dil: tuple[int, int], g: int) -> Run:
    """Per image: im2col in (C*KH*KW, HO*WO) order, then one GEMM per group ``W @ cols`` written
    straight into that image's NCHW output (no transpose afterwards).

    The gather copies whole output rows (contiguous along WO); a 1x1, stride-1, unpadded conv
    needs no im2col at all. The im2col (and padding) buffer is per-thread scratch sized for one
    image, so memory does not grow with the batch.
    """
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
    n, c, h, wd = x.shape
    oc, ci, kh, kw = w.shape
    _, _, ho, wo = o.shape
    og, kk, p = oc // g, ci * kh * kw, ho * wo
    wmat = np.ascontiguousarray(w.reshape(g, og, kk))
    outs = [o[i].reshape(g, og, p) for i in range(n)]
    if kh == kw == 1 and sh == sw == 1 and not any(pads):
        ins = [x[i].reshape(g, ci, h * wd) for i in range(n)]

        def run_1x1() -> None:
            for xi, oi in zip(ins, outs):
                np.matmul(wmat, xi, out=oi)
        return run_1x1
    dt = x.dtype
    hp, wp = h + pt + pb, wd + pl + pr
    cols_nb = _align(g * kk * p * dt.itemsize)
    pad_nb = _align(c * hp * wp * dt.itemsize) if any(pads) else 0
    kwin = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    views: dict[str, Any] = {}

    def window(img: np.ndarray) -> np.ndarray:
        win = np.lib.stride_tricks.sliding_window_view(img, kwin, axis=(1, 2))
        return win[:, ::sh, ::sw, ::dh, ::dw][:, :ho, :wo].transpose(0, 3, 4, 1, 2)  # c,kh,kw,ho,wo

    def bind(buf: np.ndarray) -> None:
        cols = buf[:g * kk * p * dt.itemsize].view(dt).reshape(g, kk, p)
        views.update(buf=buf, cols=cols, dst=cols.reshape(c, kh, kw, ho, wo))
        if pad_nb:
            padded = buf[cols_nb:cols_nb + c * hp * wp * dt.itemsize].view(dt).reshape(c, hp, wp)
            views.update(padded=padded, inner=padded[:, pt:pt + h, pl:pl + wd], srcs=[window(padded)] * n)
        else:
            views.update(srcs=[window(x[i]) for i in range(n)])

    def run() -> None:
        buf = scratch(cols_nb + pad_nb)
        if views.get("buf") is not buf:
            bind(buf)
        cols, dst, srcs = views["cols"], views["dst"], views["srcs"]
        if pad_nb:
            views["padded"].fill(0)  # the shared scratch holds another conv's bytes
        for i in range(n):
            if pad_nb:
                np.copyto(views["inner"], x[i])
            np.copyto(dst, srcs[i])
            np.matmul(wmat, cols, out=outs[i])
    return run
