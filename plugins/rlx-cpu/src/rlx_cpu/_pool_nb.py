"""Numba kernel for :mod:`rlx_cpu.pooling` (imported when a max_pool2d kernel is bound)."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _max_into(dst, src, lo, hi, step, off):
    """``dst[c] = max(dst[c], src[c * step + off])`` for ``lo <= c < hi``. NaN wins (as NumPy's max):
    ``v > m or v != v`` keeps a NaN once taken. A compare-and-select a ``c`` and no branch, so that
    the loop can vectorise (it does over the lanes of :func:`max_pool_blocked`)."""
    for c in range(lo, hi):
        v = src[c * step + off]
        m = dst[c]
        dst[c] = v if (v > m or v != v) else m


@njit(cache=True, nogil=True, error_model="numpy")
def max_pool_planes(x, o, kh, kw, sh, sw, pt, pl, lo, hi):
    """Planes ``lo:hi`` of ``o[p] = max over each window of x[p]`` (x: (P, H, W), o: (P, HO, WO)).

    Padding never wins: a window's taps outside the input are skipped. NaN wins (:func:`_max_into`).
    Per kernel tap the loop runs along a whole output row, so the compare-and-select vectorises."""
    h, w = x.shape[1], x.shape[2]
    ho, wo = o.shape[1], o.shape[2]
    for p in range(lo, hi):
        for r in range(ho):
            orow = o[p, r]
            for c in range(wo):
                orow[c] = -float("inf")
            for i in range(kh):
                ih = r * sh - pt + i
                if ih < 0 or ih >= h:
                    continue
                xrow = x[p, ih]
                for j in range(kw):
                    # the output columns whose tap j lands inside the row: 0 <= c*sw - pl + j < w
                    c0 = max(0, (pl - j + sw - 1) // sw)
                    c1 = min(wo, (w - 1 + pl - j) // sw + 1)
                    _max_into(orow, xrow, c0, c1, sw, j - pl)


@njit(cache=True, nogil=True, error_model="numpy")
def max_pool_blocked(x, o, kh, kw, sh, sw, pt, pl, lo, hi):
    """Planes ``lo:hi`` of a max pool on channel-blocked tensors (x: (P, H, W, B), o: (P, HO, WO, B),
    P = images * channel blocks, B channels a block: oneDNN's nChw16c viewed so). Same rules as
    :func:`max_pool_planes`: padding never wins, NaN wins; the B lanes of a pixel vectorise."""
    h, w, nb = x.shape[1], x.shape[2], x.shape[3]
    ho, wo = o.shape[1], o.shape[2]
    for p in range(lo, hi):
        for r in range(ho):
            for c in range(wo):
                out = o[p, r, c]
                for lane in range(nb):
                    out[lane] = -float("inf")
                for i in range(kh):
                    ih = r * sh - pt + i
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(kw):
                        iw = c * sw - pl + j
                        if iw < 0 or iw >= w:
                            continue
                        _max_into(out, x[p, ih, iw], 0, nb, 1, 0)
