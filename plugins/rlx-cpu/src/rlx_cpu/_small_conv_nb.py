"""Tiny float32 convolutions as one nogil Numba call: im2col through offset tables, oneDNN's sgemm
per group, then bias, residual and ReLU while the output is in cache.

Why: below ~0.1 M multiply-adds a convolution is all fixed cost. oneDNN's convolution primitive
spends 5-8 us in its kernel plus two layout reorders (7-12 us a conv: Whisper's conv1d stem, a ViT
patch embedding), NumPy's im2col + matmul 5-9 us in per-call overheads. Every loop here is long
(one per im2col row and one per output channel): Numba vectorises only innermost loops, and a loop
of four iterations costs its set-up (aliasing checks, remainders) for every entry. The sgemm is
called through its address (as :mod:`rlx_cpu._gemm_rows` does), so the kernel caches on disk.
"""

from __future__ import annotations

from numba import njit

from ._gemm_rows import _get_int, _set_int, _sgemm


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def conv_small(fns, x, xp, pads, koff, poff, wmat, bias, res, o, cols, g, relu):
    """``o = relu?(conv2d(x, w) + bias (+ res))`` for C-contiguous NCHW ``x``/``o``/``res``.

    ``wmat``: w as (OC, C/g*KH*KW); ``xp``: a zeroed scratch of one padded image (C, HP, WP), its
    border never written, used when ``pads`` (top, left) are not both 0 and ``koff`` / ``poff``
    are offsets into it (else into one image of ``x``); element (k, p) of the im2col matrix is
    ``src[koff[k] + poff[p]]``. ``cols``: scratch of C*KH*KW*HO*WO; ``res`` of size 0 when absent.
    """
    n, c, h, wd = x.shape
    oc, kg = wmat.shape
    k_all, p = koff.size, poff.size
    og = oc // g
    hp, wp = h + pads[0] + pads[2], wd + pads[1] + pads[3]
    padded = hp != h or wp != wd
    xf = x.reshape(-1)
    of = o.reshape(-1)
    rf = res.reshape(-1)
    prev = _get_int(fns[1])
    if prev != 1:  # one OpenMP thread: the work is far too small to share
        _set_int(fns[2], 1)
    st = 0
    for img in range(n):
        if padded:
            for ch in range(c):
                for ih in range(h):
                    d = (ch * hp + ih + pads[0]) * wp + pads[1]
                    s = ((img * c + ch) * h + ih) * wd
                    for iw in range(wd):
                        xp[d + iw] = xf[s + iw]
            src, base = xp, 0
        else:
            src, base = xf, img * c * h * wd
        for k in range(k_all):
            kb = base + koff[k]
            d = k * p
            for q in range(p):
                cols[d + q] = src[kb + poff[q]]
        ob = img * oc * p
        for gi in range(g):
            st |= _sgemm(fns[0], 78, 78, og, p, kg, wmat.ctypes.data + gi * og * kg * 4, kg,
                         cols.ctypes.data + gi * kg * p * 4, p, o.ctypes.data + (ob + gi * og * p) * 4, p)
        for k in range(oc):
            b = bias[k]
            d = ob + k * p
            if rf.size:
                for q in range(p):
                    of[d + q] += b + rf[d + q]
            else:
                for q in range(p):
                    of[d + q] += b
            if relu:
                for q in range(p):
                    v = of[d + q]
                    of[d + q] = v if not v < 0.0 else 0.0
    if prev != 1:
        _set_int(fns[2], prev)
    if st != 0:
        raise RuntimeError("oneDNN sgemm failed; set RLX_CPU_ONEDNN=0 to use OpenBLAS and report it")
