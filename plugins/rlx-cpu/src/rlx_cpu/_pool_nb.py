"""Numba kernel for :mod:`rlx_cpu.pooling` (imported when a max_pool2d kernel is bound)."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def max_pool_planes(x, o, kh, kw, sh, sw, pt, pl, lo, hi):
    """Planes ``lo:hi`` of ``o[p] = max over each window of x[p]`` (x: (P, H, W), o: (P, HO, WO)).

    Padding never wins: a window's taps outside the input are skipped. NaN wins (as NumPy's max):
    ``v > m or v != v`` keeps a NaN once taken. Per kernel tap the loop runs along a whole output
    row, so the compare-and-select vectorises."""
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
                    for c in range(c0, c1):
                        v = xrow[c * sw - pl + j]
                        m = orow[c]
                        orow[c] = v if (v > m or v != v) else m
