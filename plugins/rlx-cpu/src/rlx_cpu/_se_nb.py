"""Numba kernel for the squeeze-excitation steps of :mod:`rlx_cpu.conv_chain` (imported when a
chain with an SE step is bound)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

#: FC1's activation codes (``act``)
NONE, RELU, SILU = 0, 1, 2
#: Gate codes (``gate``): ``sigmoid(z)``, or ``min(max(a*z + b, lo), hi)`` (ONNX HardSigmoid as imported)
SIGMOID, HARD = 0, 1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _exp_neg(z, e, ki, n):
    """``exp(-z[i]) = e[i] * 2**(ki[i])`` for ``i < n`` (bits ``ki + 127 << 23``: 2**k as float32):
    Cephes' float32 polynomial, in loops LLVM vectorises (``math.exp`` is one libm call an
    element, half of a 1152-channel SE's time). Arguments are clamped to [-87, 88], so the gate
    of an infinite ``z`` is 5e-39 or 1 - 1e-38 instead of 0 or 1; NaN's exponent is 0 (unused)."""
    for i in range(n):
        v = -np.float64(z[i])
        if v != v:
            v = 0.0
        v = min(max(v, -87.0), 88.0)
        k = math.floor(v * 1.4426950408889634 + 0.5)
        r = v - k * 0.693359375 + k * 2.12194440e-4
        p = 1.9875691500e-4
        p = p * r + 1.3981999507e-3
        p = p * r + 8.3334519073e-3
        p = p * r + 4.1665795894e-2
        p = p * r + 1.6666665459e-1
        p = p * r + 5.0000001201e-1
        e[i] = p * r * r + r + 1.0
        ki[i] = (k + 127) << 23


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _image_means(xf, n, cb, hw, b, acc, inv, m):
    """``m[k*b + lane]`` = the mean over H, W of image ``n``'s channel ``k*b + lane`` (float64 sums;
    xf: the flat (N, CB, H, W, B) buffer)."""
    ub = uint64(b)
    for k in range(cb):
        acc[:] = 0.0
        base = uint64((n * cb + k) * hw * b)
        for p in range(hw):
            at = base + uint64(p) * ub
            for lane in range(ub):
                acc[lane] += xf[at + lane]
        for lane in range(b):
            m[k * b + lane] = acc[lane] * inv


@njit(cache=True, nogil=True, error_model="numpy")
def se_blocked(x, o, c, w1t, b1, act, w2t, b2, gate, ga, gb, glo, ghi, lo, hi):
    """Images ``lo:hi`` of ``o = x * gate(fc2(act(fc1(mean_hw(x)))))`` per channel.

    x, o: (N, CB, H, W, B) float32 (o may be x): nChw16c viewed so, NHWC as CB = 1 and B = its
    channels, NCHW as B = 1; channel ``k`` is lane ``k % B`` of block ``k // B``, ``c`` of them
    real, the others zero padding, which is copied (times 1, never times a NaN gate). w1t: (c, R)
    and w2t: (R, c), the 1x1 convs' weights transposed so that the inner loops run along
    independent outputs (they vectorise without reordering any sum). The means are float64 sums;
    NaN propagates as in the IR's ops (``h < 0`` is false for NaN, so ReLU and the clips keep it)."""
    nb, cb, h, w, b = x.shape
    r = w1t.shape[1]
    hw = h * w
    # Flat unsigned indexes: no negative-index wraparound check, so the lane loops vectorise.
    xf = x.reshape(-1)
    of = o.reshape(-1)
    ub = uint64(b)
    same = x.ctypes.data == o.ctypes.data
    acc = np.empty(b, np.float64)
    m = np.empty(cb * b, np.float32)
    hid = np.empty(r, np.float32)
    z = np.empty(c, np.float32)
    g = np.empty(cb * b, np.float32)
    e = np.empty(c, np.float32)
    ki = np.empty(c, np.int32)
    inv = 1.0 / hw
    for n in range(lo, hi):
        _image_means(xf, n, cb, hw, b, acc, inv, m)
        hid[:] = b1
        ur, uc = uint64(r), uint64(c)
        for i in range(uc):
            mi = m[i]
            for t in range(ur):
                hid[t] += w1t[i, t] * mi
        if act == RELU:
            for t in range(r):
                if hid[t] < 0:
                    hid[t] = 0.0
        elif act == SILU:
            for t in range(r):
                hid[t] = hid[t] / (1.0 + math.exp(-hid[t]))
        z[:] = b2
        for t in range(ur):
            ht = hid[t]
            for i in range(uc):
                z[i] += w2t[t, i] * ht
        if gate == SIGMOID:
            _exp_neg(z, e, ki, uc)
            sc = ki.view(np.float32)
            for i in range(uc):  # NaN stays NaN (its exponent was not used)
                v = z[i]
                g[i] = np.float32(1.0) / (np.float32(1.0) + e[i] * sc[i]) if v == v else v
        else:
            for i in range(uc):
                v = ga * z[i] + gb
                if v < glo:
                    v = glo
                if v > ghi:
                    v = ghi
                g[i] = v
        for i in range(c, cb * b):
            g[i] = 1.0
        for k in range(cb):
            base = uint64((n * cb + k) * hw * b)
            gk = uint64(k * b)
            for p in range(hw):
                at = base + uint64(p) * ub
                if same:  # in place: one array, or the overlap check sends LLVM to its scalar loop
                    for lane in range(ub):
                        xf[at + lane] *= g[gk + lane]
                else:
                    for lane in range(ub):
                        of[at + lane] = xf[at + lane] * g[gk + lane]


@njit(cache=True, nogil=True, error_model="numpy")
def mean_blocked(x, o, c, lo, hi):
    """Images ``lo:hi`` of ``o[n, k] = mean over H, W of channel k`` (x as in :func:`se_blocked`,
    o: (N, c) float32): a global average pool ending a chain, float64 sums."""
    nb, cb, h, w, b = x.shape
    xf = x.reshape(-1)
    acc = np.empty(b, np.float64)
    m = np.empty(cb * b, np.float32)
    inv = 1.0 / (h * w)
    for n in range(lo, hi):
        _image_means(xf, n, cb, h * w, b, acc, inv, m)
        o[n, :c] = m[:c]
