"""rlx-cpu's kernels for the recurrent ops of ``rlx_core`` (``lstm_scan``, ``gru_scan``): the whole
recurrence of a layer, every direction, in one Numba call (:mod:`rlx_cpu._recurrent_nb`), where the
decomposition runs ~20 kernels a time step. float32 only (the ops' f64 decompose: their gate
functions here are float32 arithmetic)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, DType, KernelClaim

from .kernels import Run

_MODES = {"forward": 0, "reverse": 1, "bidirectional": 2}


def _rt(r: np.ndarray) -> tuple[np.ndarray, bool]:
    """``R[d].T`` for every direction, C-contiguous ``[D, H, G*H]``, and whether it must be refreshed
    before every run: a constant (read-only: the program's weights) is laid out once, at bind time."""
    rt = np.ascontiguousarray(r.transpose(0, 2, 1))
    if r.flags.writeable:
        return rt, True
    rt.flags.writeable = False
    return rt, False


def _c(x: np.ndarray) -> np.ndarray:
    """``x`` itself when C-contiguous (the arena's views are), else a C-contiguous stand-in (Numba
    then compiles one layout only)."""
    return x if x.flags.c_contiguous else np.empty(x.shape, x.dtype)


def _bind(fn: Any, args: Sequence[Any], copy_in: Sequence[tuple[np.ndarray, Any]],
          copy_out: Sequence[tuple[np.ndarray, np.ndarray]]) -> Run:
    """``fn(*args)`` as a run, after the ``(dst, src)`` copies of ``copy_in`` and before those of
    ``copy_out`` (stand-ins for non-contiguous views, a transposed R that is not a constant)."""
    pre = [(d, s) for d, s in copy_in if d is not s]
    post = [(d, s) for d, s in copy_out if d is not s]
    a = tuple(args)
    if not pre and not post:
        return lambda: fn(*a)

    def run() -> None:
        for dst, src in pre:
            np.copyto(dst, src)
        fn(*a)
        for dst, src in post:
            np.copyto(dst, src)
    return run


def _operands(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], extra: np.ndarray
              ) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[np.ndarray, Any]],
                         list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """C-contiguous ``(inputs but r, with extra last; outputs; copies in; copies out; R.T)``."""
    srcs = [ins[0], *ins[2:], extra]
    cin = [_c(v) for v in srcs]
    cout = [_c(v) for v in outs]
    rt, fresh = _rt(ins[1])
    copy_in: list[tuple[np.ndarray, Any]] = list(zip(cin, srcs))
    if fresh:
        copy_in.append((rt, ins[1].transpose(0, 2, 1)))
    return cin, cout, copy_in, list(zip(outs, cout)), rt


def k_lstm_scan(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    from ._recurrent_nb import lstm_f32

    nd, gates, hid = ins[1].shape
    batch = ins[0].shape[1]
    has_p = len(ins) > 4
    cin, cout, copy_in, copy_out, rt = _operands(
        ins[:4], outs, ins[4] if has_p else np.zeros((nd, 3 * hid), np.float32))
    xw, h0, c0, p = cin
    # 1 where a column's gate function is sigmoid (i, o, f), 2 where it is tanh (the cell input)
    sc = np.tile(np.repeat(np.array([1, 1, 1, 2], np.float32), hid), batch)
    work = np.empty((3, batch * gates), np.float32)
    bits = np.empty(batch * gates, np.int32)
    mode = _MODES[str(attrs["direction"])]
    return _bind(lstm_f32, (xw, rt, h0, c0, p, has_p, mode, *cout, work, bits, sc), copy_in, copy_out)


def k_gru_scan(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    from ._recurrent_nb import gru_f32

    nd, gates, hid = ins[1].shape
    batch = ins[0].shape[1]
    has_rb = len(ins) > 3
    cin, cout, copy_in, copy_out, rt = _operands(
        ins[:3], outs, ins[3] if has_rb else np.zeros((nd, hid), np.float32))
    xw, h0, rb = cin
    rth = np.ascontiguousarray(rt[:, :, 2 * hid:])  # the candidate's columns of R.T
    if rt.flags.writeable:  # R is no constant: refreshed every run, like rt
        copy_in.append((rth, ins[1][:, 2 * hid:].transpose(0, 2, 1)))
    work = np.empty((4, batch * gates), np.float32)
    bits = np.empty(batch * gates, np.int32)
    lbr, mode = bool(attrs["linear_before_reset"]), _MODES[str(attrs["direction"])]
    return _bind(gru_f32, (xw, rt, rth, h0, rb, has_rb, lbr, mode, *cout, work, bits), copy_in, copy_out)


FACTORIES: dict[str, Any] = {"cpu.lstm_scan": k_lstm_scan, "cpu.gru_scan": k_gru_scan}


def claims() -> list[KernelClaim]:
    """f32 (the ops' f64 decomposes: see the module doc)."""
    f32 = frozenset({DType.F32})
    return [KernelClaim("lstm_scan", "cpu.lstm_scan", dtypes=f32, out_dtypes=f32,
                        constraint="f32 (Numba, float32 gate functions)"),
            KernelClaim("gru_scan", "cpu.gru_scan", dtypes=f32, out_dtypes=f32,
                        constraint="f32 (Numba, float32 gate functions)")]
