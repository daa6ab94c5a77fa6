"""A softmax or log-softmax as one oneDNN primitive (for programs that load oneDNN anyway).

Why: NumPy's form is five ufunc calls (max, subtract, exp, sum, divide), ~0.7-1 us each on the
small rows of a classifier's head: the MLP 784-512-256-10's softmax took 3.7 us at batch 1 and
4.7 at batch 8 against ONNX Runtime's ~0.5. oneDNN's primitive is one call (1.8-1.9 us, most of it
ctypes), vectorised exp included (batch 256: 7 against 23 us).

NaN semantics: the NumPy form's (a NaN or +inf in a row, or a row of -inf, makes the whole row NaN).
oneDNN's max skips a NaN and its exp sends one to 0, so such a row comes out NaN only where the
input was (or every element, for the -inf row); a NaN in the output therefore marks every bad row,
and one dot product over the output (~0.5 us) finds them: only then are those rows set to NaN
(tests check all three cases). Every row is reduced by one thread, so the bits do not depend on the
thread count. The primitives run on the OpenMP team of the program's other oneDNN steps (one per
thread count, :class:`rlx_cpu.parallel.PerTeam`), however small: a one-thread primitive between
team ones made the team's threads go to sleep and wake (the MLP at batch 1: its two team linears
16 + 9 us against 11 + 5.6 with the head on the team).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import onednn_conv as oc
from .parallel import PerTeam, pool

Run = Callable[[], None]

_SOFTMAX, _LOG_SOFTMAX = 0x30000, 0x30001  # dnnl_softmax_accurate, dnnl_softmax_log



def usable(x: np.ndarray, o: np.ndarray) -> bool:
    """float32 operands of equal shape with positive element strides, and oneDNN loadable."""
    return (x.dtype == np.float32 and o.dtype == np.float32 and x.shape == o.shape and 1 <= x.ndim <= 6
            and x.size > 0 and all(s > 0 and s % 4 == 0 for a in (x, o) for s in a.strides)
            and oc.USE and oc.available())


def softmax_run(x: np.ndarray, o: np.ndarray, axis: int, log: bool) -> Run | None:
    """``o = softmax(x)`` (``log``: log-softmax) over ``axis`` (normalised), or None where oneDNN
    cannot (missing, refused operands)."""
    if not usable(x, o):
        return None
    api = oc._api()
    if api is None:
        return None
    alg = _LOG_SOFTMAX if log else _SOFTMAX

    try:
        teams = PerTeam(lambda n: oc.made_for(api, n, lambda: _steps(api, x, o, axis, alg)), pool())
    except oc.OneDNNError:
        return None
    return _nan_rows_whole(teams, o, axis)


def head_run(x: np.ndarray, w: np.ndarray, b: np.ndarray, t: np.ndarray, o: np.ndarray, axis: int,
             log: bool) -> Run | None:
    """A classifier head, ``t = x @ w.T + b`` then ``o = softmax(t)`` (``log``: log-softmax), as
    two oneDNN primitives run by one call on the team: the MLP's 256 -> 10 head at batch 8 was
    ``np.dot`` + ``np.add`` (2.5 us) and the softmax primitive (its own call: ~2.3 us); None where
    oneDNN refuses it."""
    from . import onednn_linear

    if not (usable(t, o) and onednn_linear.usable(x, w, b, t)):
        return None
    api = oc._api()
    if api is None:
        return None
    alg = _LOG_SOFTMAX if log else _SOFTMAX

    def both() -> oc.Steps:
        lin, keep1, impl1 = onednn_linear.steps_for(api, x, w, b, t, False)
        sm, keep2, impl2 = _steps(api, t, o, axis, alg)
        return lin + sm, keep1 + keep2, [impl1, impl2]

    try:
        teams = PerTeam(lambda n: oc.made_for(api, n, both), pool())
    except oc.OneDNNError:
        return None
    return _nan_rows_whole(teams, o, axis)


def _nan_rows_whole(teams: PerTeam[Run], o: np.ndarray, axis: int) -> Run:
    """The team's primitives, then the NumPy form's NaN rows (see the module's docstring). The run
    carries ``team`` and ``after`` (the NaN-row pass) for :func:`rlx_cpu.dense.merge_teams`."""
    flat = o.reshape(-1) if o.flags.c_contiguous else None
    ones = np.ones(o.size, np.float32)
    dot, isnan = np.dot, math.isnan
    get = teams.get

    def nan_rows(arr: np.ndarray) -> None:
        bad = np.isnan(arr).any(axis=axis, keepdims=True)
        np.copyto(arr, np.float32(np.nan), where=bad)

    def after(arr: np.ndarray | None = None) -> None:
        """The NaN-row pass on the output, or on ``arr``: a C-contiguous copy of it (a program's
        run of :func:`rlx_cpu._dispatch.run_io` copies the output out before this pass)."""
        # softmax outputs are finite, log-softmax's at most -inf: the sum is NaN only with a NaN
        if arr is None:
            if isnan(dot(flat, ones) if flat is not None else np.add.reduce(o, axis=None)):
                nan_rows(o)
        elif isnan(dot(arr.reshape(-1), ones)):
            nan_rows(arr)

    def run() -> None:
        get()()
        after()
    run.onednn_impl = teams.full.onednn_impl  # type: ignore[attr-defined]
    run.team = teams  # type: ignore[attr-defined]
    run.after = after  # type: ignore[attr-defined]
    # The NaN-row pass is a BLAS dot, isnan and a masked copy: no NumPy arithmetic that could
    # signal a floating-point error (rlx_cpu.program runs such programs without an errstate).
    run.fp_quiet = True  # type: ignore[attr-defined]
    return run


def _steps(api: dict[str, Any], x: np.ndarray, o: np.ndarray, axis: int, alg: int) -> oc.Steps:
    p = oc._Prim(api)
    x_md = p.md_plain(x.shape, oc._strides_elems(x))
    o_md = p.md_plain(o.shape, oc._strides_elems(o))
    pd = oc._VP()
    p.check(api["fns"]["dnnl_softmax_forward_primitive_desc_create"](
        ctypes.byref(pd), api["engine"], oc._FWD_INFERENCE, alg, x_md, o_md, axis, p.attr()),
        "softmax primitive_desc")
    p.owned.append(("dnnl_primitive_desc_destroy", pd))
    prim = p.primitive(pd)
    pairs = [(oc._ARG_SRC, p.memory(x_md, x.ctypes.data)), (oc._ARG_DST, p.memory(o_md, o.ctypes.data))]
    keep: list[Any] = [p, x, o]
    pairs += p.own_scratchpad(pd, keep)
    args = (oc._ExecArg * len(pairs))(*(oc._ExecArg(a, mem) for a, mem in pairs))
    keep.append(args)
    return [(prim, args)], keep, oc.impl_info(api, pd)
