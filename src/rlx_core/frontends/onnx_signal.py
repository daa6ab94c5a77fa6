"""ONNX signal-processing operators as exact RLX decompositions (issue 17).

DFT (opset 17 and 20 forms) and STFT are matrix products with a DFT matrix built at import: every
entry ``exp(-+2 pi i j k / n)`` is computed in float64 from ``(j * k) mod n`` (so large products lose
nothing) and rounded once to the signal's dtype. Window functions (HannWindow, HammingWindow,
BlackmanWindow) and MelWeightMatrix whose inputs are constants are folded at import by the generic
constant folding; a window with a run-time size is :mod:`~rlx_core.frontends.onnx_misc2`'s (staged
on the size, computed on the backend); MelWeightMatrix with run-time inputs is refused (its output
shape is data-dependent). The handlers register in :mod:`rlx_core.frontends.onnx`'s table (that module
imports this one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from .onnx import _Const, _handler, _Importer

_MALFORMED = "the model is malformed: check it with onnx.checker.check_model"


def _static(imp: _Importer, x: Tensor, what: str) -> tuple[int, ...]:
    syms = [d for d in x.shape if isinstance(d, str)]
    if syms:
        raise imp.symbolic(f"{what} needs static dims, got {x.shape}", [str(s) for s in syms])
    return tuple(int(d) for d in x.shape)


def _const_int(imp: _Importer, v: Any, what: str, default: int | None) -> int | None:
    """An optional scalar int input that must be known at import (it sets the output shape)."""
    if v is None:
        return default
    if not isinstance(v, _Const):
        raise imp.unsupported(f"{what} is computed at run time from tensor data, so the result's shape is "
                              f"data-dependent", fix=f"give {what} as a constant (an initializer)")
    a = np.asarray(v.array)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise imp.unsupported(f"{what} must be an integer scalar, got shape {a.shape} dtype {a.dtype}",
                              fix=_MALFORMED)
    return int(a.reshape(-1)[0])


def _dft_matrices(n_in: int, n_out: int, length: int, inverse: bool, real_out: bool,
                  np_dt: Any) -> tuple[np.ndarray, np.ndarray]:
    """C, S (n_in x n_out) with ``Y = X @ (C + i S)``: the DFT of a length-``length`` signal whose
    first ``n_in`` samples are given (the rest are zeros), bins ``0..n_out-1``.

    ``real_out`` is the inverse of a one-sided spectrum (NumPy's irfft): bin k stands for itself and
    its mirror n - k, so it counts twice except DC and (even n) Nyquist, and the imaginary parts of
    those two are ignored (their sine rows are exactly zero)."""
    j = np.arange(n_in, dtype=np.int64)[:, None]
    k = np.arange(n_out, dtype=np.int64)[None, :]
    ang = 2.0 * np.pi * ((j * k) % length).astype(np.float64) / length
    if real_out:  # rows are the given bins, columns the output samples
        c, s = np.cos(ang), -np.sin(ang)  # Re((Xr + i Xi) e^{+i a}) = Xr cos a - Xi sin a
        w = np.full((n_in, 1), 2.0)
        w[0] = 1.0
        if length % 2 == 0 and n_in > length // 2:
            w[length // 2] = 1.0
        c, s = c * w / length, s * w / length
        s[0, :] = 0.0
        if length % 2 == 0 and n_in > length // 2:
            s[length // 2, :] = 0.0
        return c.astype(np_dt), s.astype(np_dt)
    sign = 1.0 if inverse else -1.0
    c, s = np.cos(ang), sign * np.sin(ang)
    if inverse:
        c, s = c / length, s / length
    return c.astype(np_dt), s.astype(np_dt)


def _dft_last(imp: _Importer, xr: Tensor, xi: Tensor | None, length: int, inverse: bool,
              onesided: bool) -> tuple[Tensor, Tensor | None]:
    """The DFT along the last axis of ``xr + i xi`` (``xi`` None: a real signal). Returns the real
    and imaginary parts (imaginary None for an inverse one-sided transform, whose result is real)."""
    g = imp.g
    n = int(xr.shape[-1])
    if inverse and onesided:
        n_in = min(n, length // 2 + 1)
        n_out, real_out = length, True
    else:
        n_in = min(n, length)
        n_out, real_out = (length // 2 + 1 if onesided else length), False
    if n_in < n:  # samples past dft_length are dropped (bins past the one-sided half likewise)
        xr = g.op("slice", xr, starts=(0,), stops=(n_in,), axes=(xr.rank - 1,))
        xi = None if xi is None else g.op("slice", xi, starts=(0,), stops=(n_in,), axes=(xi.rank - 1,))
    c, s = _dft_matrices(n_in, n_out, length, inverse, real_out, xr.dtype.np)
    ct, st = imp.param(c), imp.param(s)
    if real_out:
        yr = xr @ ct
        if xi is not None:
            yr = yr + xi @ st
        return yr, None
    yr, yi = xr @ ct, xr @ st
    if xi is not None:  # (xr + i xi)(c + i s) = (xr c - xi s) + i (xr s + xi c)
        yr, yi = yr - xi @ st, yi + xi @ ct
    return yr, yi


def _split_complex(imp: _Importer, x: Tensor, op: str) -> tuple[Tensor, Tensor | None]:
    """A [..., 1] (real) or [..., 2] (real, imaginary) tensor as its parts, without the last axis."""
    g = imp.g
    last = x.shape[-1]
    if last not in (1, 2):
        raise imp.unsupported(f"{op} input's last dim is {last}; it must be 1 (real) or 2 (complex)",
                              fix=_MALFORMED)
    keep = x.shape[:-1]
    xr = g.op("reshape", g.op("slice", x, starts=(0,), stops=(1,), axes=(x.rank - 1,)), shape=keep)
    if last == 1:
        return xr, None
    xi = g.op("reshape", g.op("slice", x, starts=(1,), stops=(2,), axes=(x.rank - 1,)), shape=keep)
    return xr, xi


def _join_complex(imp: _Importer, yr: Tensor, yi: Tensor | None) -> Tensor:
    g = imp.g
    parts = [yr] if yi is None else [yr, yi]
    return g.op("concat", *[g.op("reshape", p, shape=(*p.shape, 1)) for p in parts], axis=yr.rank)


def _compute_dtype(imp: _Importer, x: Tensor, op: str) -> Tensor:
    if not x.dtype.is_float or x.dtype.is_complex:
        raise imp.unsupported(f"{op} on {x.dtype}", fix=f"{op} takes float tensors; cast in the model")
    # f16/bf16 sums of n products would round at every step: accumulate in float32.
    return imp.g.op("cast", x, to=DType.F32) if x.dtype in (DType.F16, DType.BF16) else x


@_handler("DFT")
def _dft(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x0 = imp.t(ins[0])
    x = _compute_dtype(imp, x0, "DFT")
    shape = _static(imp, x, "DFT")
    r = len(shape)
    if imp.opset >= 20:
        axis = _const_int(imp, ins[2] if len(ins) > 2 else None, "DFT axis", -2)
    else:
        axis = int(attrs.get("axis", 1))
    assert axis is not None
    if not -r <= axis <= r - 2 or axis % r == r - 1:
        raise imp.unsupported(f"DFT axis {axis} is outside [-{r}, -2] U [0, {r - 2}] for input rank {r}",
                              fix=_MALFORMED)
    axis %= r
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    n = shape[axis]
    default = 2 * (n - 1) if inverse and onesided else n
    length = _const_int(imp, ins[1] if len(ins) > 1 else None, "DFT dft_length", default)
    assert length is not None
    if length < 1:
        raise imp.unsupported(f"DFT dft_length is {length}; it must be >= 1", fix=_MALFORMED)
    xr, xi = _split_complex(imp, x, "DFT")
    # Move the signal axis last, transform, move it back.
    sig_rank = r - 1
    perm = [a for a in range(sig_rank) if a != axis] + [axis]
    inv = list(np.argsort(perm))
    if axis != sig_rank - 1:
        xr = g.op("transpose", xr, perm=tuple(perm))
        xi = None if xi is None else g.op("transpose", xi, perm=tuple(perm))
    yr, yi = _dft_last(imp, xr, xi, length, inverse, onesided)
    if axis != sig_rank - 1:
        yr = g.op("transpose", yr, perm=tuple(int(p) for p in inv))
        yi = None if yi is None else g.op("transpose", yi, perm=tuple(int(p) for p in inv))
    y = _join_complex(imp, yr, yi)
    return [y if y.dtype == x0.dtype else g.op("cast", y, to=x0.dtype)]


@_handler("STFT")
def _stft(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Frames ``[f * step, f * step + frame_length)`` gathered with a constant index map, times the
    window, then a (one-sided by default) DFT of length frame_length along the frame."""
    g = imp.g
    x0 = imp.t(ins[0])
    x = _compute_dtype(imp, x0, "STFT")
    shape = _static(imp, x, "STFT")
    if len(shape) != 3:
        raise imp.unsupported(f"STFT signal has shape {shape}; it must be [batch, length, 1 or 2]",
                              fix=_MALFORMED)
    step = _const_int(imp, ins[1] if len(ins) > 1 else None, "STFT frame_step", None)
    if step is None or step < 1:
        raise imp.unsupported(f"STFT frame_step is {step}; it must be a positive constant", fix=_MALFORMED)
    window = ins[2] if len(ins) > 2 else None
    win_t = None if window is None else imp.t(window)
    win_len = None if win_t is None else _static(imp, win_t, "STFT window")[0]
    frame_length = _const_int(imp, ins[3] if len(ins) > 3 else None, "STFT frame_length",
                              win_len if win_len is not None else shape[1])
    assert frame_length is not None
    if win_len is not None and win_len != frame_length:
        raise imp.unsupported(f"STFT window has length {win_len} but frame_length is {frame_length}",
                              fix="give a window of frame_length samples")
    if not 1 <= frame_length <= shape[1]:
        raise imp.unsupported(f"STFT frame_length {frame_length} does not fit the signal length {shape[1]}",
                              fix=_MALFORMED)
    onesided = bool(attrs.get("onesided", 1))
    xr, xi = _split_complex(imp, x, "STFT")
    if xi is not None and onesided:
        raise imp.unsupported("STFT onesided=1 of a complex signal is not defined",
                              fix="set onesided=0 for complex signals")
    frames = 1 + (shape[1] - frame_length) // step
    idx = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(frame_length, dtype=np.int64)[None, :]
    it = g.const(idx, DType.I64) if idx.size <= 16 else imp.param(idx)
    fr = g.op("gather", xr, it, axis=1)  # [batch, frames, frame_length]
    fi = None if xi is None else g.op("gather", xi, it, axis=1)
    if win_t is not None:
        w = win_t if win_t.dtype == fr.dtype else g.op("cast", win_t, to=fr.dtype)
        fr = fr * w
        fi = None if fi is None else fi * w
    yr, yi = _dft_last(imp, fr, fi, frame_length, False, onesided)
    y = _join_complex(imp, yr, yi)
    return [y if y.dtype == x0.dtype else g.op("cast", y, to=x0.dtype)]


def _runtime_size(op: str, what: str) -> Any:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        # Constant inputs never reach here: the importer folds the node with onnx's reference.
        raise imp.unsupported(f"{op} {what} is computed at run time from tensor data, so the result's shape "
                              f"is data-dependent",
                              fix=f"give the {op} inputs as constants (initializers); it is then computed "
                                  f"at import")
    return h


# HannWindow/HammingWindow/BlackmanWindow with a run-time size: onnx_misc2 (computed on the backend).
_handler("MelWeightMatrix")(_runtime_size("MelWeightMatrix", "num_mel_bins/dft_length/sample_rate"))
