"""The Numba recurrences of ``lstm_scan`` and ``gru_scan`` in float32 (see :mod:`rlx_cpu.recurrent`),
compiled on first use and cached next to this file (or in NUMBA_CACHE_DIR).

A step of a small layer (the zoo's: H = 24) is ~2300 multiply-adds and ~100 sigmoids/tanhs a batch
row. The product ``h @ R.T`` runs as rank-8 updates of the gate row (``g += h[k:k+8] @ R.T[k:k+8]``
in a fixed order, :func:`_acc`): the inner loop has no reduction, so LLVM vectorizes it without
fastmath, and ``g`` is loaded and stored once per eight rows of ``R.T`` (4-8x faster than one). The
gates of every batch row of a step then go through one pass of the gate functions. The gate
functions would cost more than the product through libm's scalar ``expf``/``tanhf`` (Numba has no
vector math library here: 10-30 ns each), so ``exp`` is Cephes' ``expf`` written out (range
reduction by ln 2 in two parts, a degree-6 polynomial, the power of two built in the exponent bits
of an int32 scratch array read back through a float32 view): plain arithmetic that vectorizes,
a sigmoid within ~2 ulp of the correctly rounded one (measured over [-20, 20]).
``sigmoid(x) = 1 / (1 + exp(-x))`` and ``tanh(x) = 2 sigmoid(2x) - 1`` (an absolute error of a few
1e-8 near 0, inside the op's tolerance: ``rlx_core.ir.ops.recurrent``). No fastmath: no
contraction, NaN and Inf propagate as in the reference (the clamp of the exponent is written so that
NaN passes through it).
``error_model="numpy"``: Python's error model checks every float division for zero, a branch that
keeps LLVM from vectorizing the loop (5 us instead of 80 ns for 768 sigmoids).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_LOG2E = np.float32(1.44269504088896341)
_C1 = np.float32(0.693359375)  # ln 2 in two parts (Cephes): C1 exact in a few bits, C1 - C2 = ln 2
_C2 = np.float32(-2.12194440e-4)
_P0 = np.float32(1.9875691500e-4)
_P1 = np.float32(1.3981999507e-3)
_P2 = np.float32(8.3334519073e-3)
_P3 = np.float32(4.1665795894e-2)
_P4 = np.float32(1.6666665459e-1)
_P5 = np.float32(5.0000001201e-1)
_HI = np.float32(88.0)  # exp(88) < FLT_MAX; 1 / (1 + exp(88)) is 0 to within 6e-39
_LO = np.float32(-87.0)  # 2**n stays a normal float
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
_HALF = np.float32(0.5)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _exp_split(x):
    """``exp(x)`` as ``(p, e)``: ``p`` the polynomial part, ``e`` the int32 bits of the float32
    ``2**n`` (read back through a float32 view); ``exp(x) = p * 2**n``, NaN for NaN."""
    # min/max written as comparisons that are False for NaN: NaN stays NaN
    x = _HI if x > _HI else x
    x = _LO if x < _LO else x
    n = np.floor(x * _LOG2E + _HALF)
    r = x - n * _C1 - n * _C2
    z = r * r
    y = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    e = (np.int32(n) + np.int32(127)) << np.int32(23) if n == n else np.int32(0x7FC00000)
    return y * z + r + _ONE, e


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _sigmoid(src, scale, dst, pw, bits, fbits):
    """``dst[j] = sigmoid(scale * src[j])`` for every ``j`` of ``src`` (``pw``, ``bits``/``fbits``:
    scratch at least as long)."""
    for j in range(src.shape[0]):
        pw[j], bits[j] = _exp_split(-(scale * src[j]))
    for j in range(src.shape[0]):
        dst[j] = _ONE / (_ONE + pw[j] * fbits[j])


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _gates(src, n, sc, dst, pw, bits, fbits):
    """``dst[i] = sc[i] * sigmoid(sc[i] * src[i]) + 1 - sc[i]`` for ``i < n``: ``sigmoid`` where
    ``sc`` is 1, ``tanh`` where it is 2 (one pass over every gate of every batch row)."""
    for i in range(n):
        pw[i], bits[i] = _exp_split(-(sc[i] * src[i]))
    for i in range(n):
        dst[i] = sc[i] / (_ONE + pw[i] * fbits[i]) + (_ONE - sc[i])


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _acc(gb, hb, rt, m):
    """``gb[j] += sum_k hb[k] * rt[k, j]`` for ``j < m``: eight rows of ``rt`` a pass over ``gb``
    (one pass a row loads and stores ``gb`` once per multiply-add: 4-8x slower at these sizes)."""
    hid = rt.shape[0]
    k8 = hid - hid % 8
    for k0 in range(0, k8, 8):
        h0, h1, h2, h3 = hb[k0], hb[k0 + 1], hb[k0 + 2], hb[k0 + 3]
        h4, h5, h6, h7 = hb[k0 + 4], hb[k0 + 5], hb[k0 + 6], hb[k0 + 7]
        r0, r1, r2, r3 = rt[k0], rt[k0 + 1], rt[k0 + 2], rt[k0 + 3]
        r4, r5, r6, r7 = rt[k0 + 4], rt[k0 + 5], rt[k0 + 6], rt[k0 + 7]
        for j in range(m):
            gb[j] += (((h0 * r0[j] + h1 * r1[j]) + (h2 * r2[j] + h3 * r3[j]))
                      + ((h4 * r4[j] + h5 * r5[j]) + (h6 * r6[j] + h7 * r7[j])))
    for k in range(k8, hid):
        hk = hb[k]
        rk = rt[k]
        for j in range(m):
            gb[j] += hk * rk[j]


@njit(cache=True, nogil=True, error_model="numpy")
def lstm_f32(xw, rt, h0, c0, p, has_p, mode, y, h, c, work, bits, sc):
    """ONNX LSTM over ``xw`` ``[T, B, D*4H]``: ``y`` ``[T, D, B, H]`` and the final states in ``h``,
    ``c`` (``[D, B, H]``; ``h0``, ``c0`` the same); ``rt`` ``[D, H, 4H]`` (``R[d].T``), ``p``
    ``[D, 3H]``. ``mode``: 0 forward, 1 reverse, 2 bidirectional (direction 1 reversed)."""
    gates = rt.shape[2]
    for d in range(rt.shape[0]):
        _lstm_dir(xw[:, :, d * gates:(d + 1) * gates], rt[d], h0[d], c0[d], p[d], has_p,
                  mode == 1 or d == 1, y[:, d], h[d], c[d], work, bits, sc)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _lstm_dir(xw, rt, h0, c0, p, has_p, reverse, y, h, c, work, bits, sc):
    """One direction over ``xw`` ``[T, B, 4H]``: ``y`` ``[T, B, H]`` and the final states in ``h``,
    ``c`` (``[B, H]``; ``h0``, ``c0`` the same).

    ``rt`` is ``R.T`` (``[H, 4H]``); ``work`` (float32 ``[3, B*4H]``), ``bits`` (int32 ``[B*4H]``)
    are scratch; ``sc`` (``[B*4H]``) is 1 in the sigmoid gates' columns (i, o, f), 2 in the cell
    input's (tanh): all gates of all rows go through one pass of the gate functions a step. Every
    index is the variable of a ``range`` loop from 0 (gates are sliced out first): Numba then drops
    its negative-index wraparound, which would keep LLVM from vectorizing the loop."""
    steps, batch, gates = xw.shape
    hid = gates // 4
    n = batch * gates
    gf, af, pw = work[0], work[1], work[2]
    g, a = gf.reshape(batch, gates), af.reshape(batch, gates)
    fbits = bits.view(np.float32)
    cf = c.reshape(batch * hid)
    th = gf[:batch * hid].reshape(batch, hid)  # tanh(c) (g is free once the gates are computed)
    p_i, p_o, p_f = p[:hid], p[hid:2 * hid], p[2 * hid:3 * hid]
    for b in range(batch):
        for j in range(hid):
            h[b, j] = h0[b, j]
            c[b, j] = c0[b, j]
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        for b in range(batch):
            gb = g[b]
            xb = xw[t, b]
            for j in range(gates):
                gb[j] = xb[j]
            _acc(gb, h[b], rt, gates)
            if has_p:  # i and f see the previous cell state, o the new one (below)
                cb, gi, gff = c[b], gb[:hid], gb[2 * hid:3 * hid]
                for j in range(hid):
                    gi[j] += p_i[j] * cb[j]
                    gff[j] += p_f[j] * cb[j]
        _gates(gf, n, sc, af, pw, bits, fbits)
        for b in range(batch):
            ab, cb = a[b], c[b]
            ai, af_, ac = ab[:hid], ab[2 * hid:3 * hid], ab[3 * hid:]
            for j in range(hid):
                cb[j] = af_[j] * cb[j] + ai[j] * ac[j]
        if has_p:
            for b in range(batch):
                go, cb = g[b][hid:2 * hid], c[b]
                for j in range(hid):
                    go[j] += p_o[j] * cb[j]
                _sigmoid(go, _ONE, a[b][hid:2 * hid], pw, bits, fbits)
        _sigmoid(cf, _TWO, gf, pw, bits, fbits)  # gf[:B*H] = sigmoid(2c)
        for b in range(batch):
            ao, tb, hb, yb = a[b][hid:2 * hid], th[b], h[b], y[t, b]
            for j in range(hid):
                hn = ao[j] * (_TWO * tb[j] - _ONE)
                hb[j] = hn
                yb[j] = hn


@njit(cache=True, nogil=True, error_model="numpy")
def gru_f32(xw, rt, rth, h0, rb, has_rb, lbr, mode, y, h, work, bits):
    """ONNX GRU over ``xw`` ``[T, B, D*3H]``: ``y`` ``[T, D, B, H]`` and the final state in ``h``
    (``[D, B, H]``; ``h0`` the same); ``rt`` ``[D, H, 3H]``, ``rth`` ``[D, H, H]``, ``rb`` ``[D, H]``;
    ``mode`` as in :func:`lstm_f32`."""
    gates = rt.shape[2]
    for d in range(rt.shape[0]):
        _gru_dir(xw[:, :, d * gates:(d + 1) * gates], rt[d], rth[d], h0[d], rb[d], has_rb, lbr,
                 mode == 1 or d == 1, y[:, d], h[d], work, bits)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _gru_dir(xw, rt, rth, h0, rb, has_rb, lbr, reverse, y, h, work, bits):
    """One direction over ``xw`` ``[T, B, 3H]``: ``y`` ``[T, B, H]`` and the final state in ``h``
    (``[B, H]``; ``h0`` the same).

    ``rt`` is ``R.T`` (``[H, 3H]``), ``rth`` its candidate columns ``[H, H]``; ``rb`` the candidate's
    recurrent bias ``[H]`` (``has_rb``); ``work`` (float32 ``[4, B*3H]``) and ``bits`` (int32
    ``[B*3H]``) scratch. Indices as in :func:`lstm_f32`."""
    steps, batch, gates = xw.shape
    hid = gates // 3
    gf, af, pw, tf = work[0], work[1], work[2], work[3]
    g, a = gf.reshape(batch, gates), af.reshape(batch, gates)
    tcf = tf[:batch * hid]
    tmp = tcf.reshape(batch, hid)
    fbits = bits.view(np.float32)
    upto = gates if lbr else 2 * hid
    for b in range(batch):
        for j in range(hid):
            h[b, j] = h0[b, j]
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        # a row of g: the z and r pre-activations, then h @ Rh.T + rb with lbr (else unused)
        for b in range(batch):
            gb = g[b]
            xb = xw[t, b]
            for j in range(2 * hid):
                gb[j] = xb[j]
            if lbr:
                gh = gb[2 * hid:]
                for j in range(hid):
                    gh[j] = rb[j] if has_rb else np.float32(0.0)
            _acc(gb, h[b], rt, upto)
        # sigmoid of every column (the candidate's are not used: one unbroken pass is faster)
        _sigmoid(gf, _ONE, af, pw, bits, fbits)
        for b in range(batch):
            gb, tb, hb = g[b], tmp[b], h[b]
            ar, xh = a[b][hid:2 * hid], xw[t, b][2 * hid:]
            if lbr:  # candidate = tanh(xh + r * (h @ Rh.T + rb))
                gh = gb[2 * hid:]
                for j in range(hid):
                    tb[j] = xh[j] + ar[j] * gh[j]
            else:  # candidate = tanh(xh + (r * h) @ Rh.T + rb)
                rh = gb[:hid]  # r * h, where z's pre-activation was (z and r are in a now)
                for j in range(hid):
                    rh[j] = ar[j] * hb[j]
                for j in range(hid):
                    tb[j] = rb[j] if has_rb else np.float32(0.0)
                _acc(tb, rh, rth, hid)
                for j in range(hid):
                    tb[j] += xh[j]
        _sigmoid(tcf, _TWO, tcf, pw, bits, fbits)
        for b in range(batch):
            az, tb, hb, yb = a[b], tmp[b], h[b], y[t, b]
            for j in range(hid):
                z = az[j]
                hn = (_ONE - z) * (_TWO * tb[j] - _ONE) + z * hb[j]
                hb[j] = hn
                yb[j] = hn
