"""Recurrent ops: a whole LSTM or GRU layer (every direction) as one node.

ONNX's LSTM and GRU (:mod:`rlx_core.frontends.onnx_rnn`) are a loop over time whose every step is a
small matrix product and a few gate functions. Written out as per-step MIR ops that is ~20 kernels a
step (what every backend can run); as one node a backend runs the recurrence in one call, the way
ONNX Runtime's fused kernels do. The input projection of all steps is *not* part of the op (one
``linear`` before it does it for every step and direction at once), so the op takes it
precomputed. Shapes follow ONNX's (layout 0), with ``D`` directions (2 for ``bidirectional``):

* ``lstm_scan(xw [T,B,D*4H], r [D,4H,H], h0 [D,B,H], c0 [D,B,H][, p [D,3H]]) -> (y [T,D,B,H],
  h_T [D,B,H], c_T [D,B,H])``: per direction ``gates = xw[t][.., d*4H:(d+1)*4H] + h @ r[d].T`` in
  ONNX's gate order i, o, f, c (both biases folded into ``xw``); ``i, f = sigmoid(gi + p_i*c),
  sigmoid(gf + p_f*c)``; ``c = f*c + i*tanh(gc)``; ``o = sigmoid(go + p_o*c)``; ``h = o*tanh(c)``.
  ``p`` (peepholes, order i, o, f) is optional.
* ``gru_scan(xw [T,B,D*3H], r [D,3H,H], h0 [D,B,H][, rb [D,H]]) -> (y [T,D,B,H], h_T [D,B,H])``: gate
  order z, r, h; ``z, r = sigmoid(xw_z + h @ r_z.T), sigmoid(xw_r + h @ r_r.T)``; the candidate
  ``n = tanh(xw_h + (r*h) @ r_h.T + rb)`` (``linear_before_reset=0``) or
  ``tanh(xw_h + r*(h @ r_h.T + rb))`` (``=1``, PyTorch's GRU); ``h = (1-z)*n + z*h``. ``rb`` is the
  recurrent bias of the candidate (the one bias that cannot be folded into ``xw`` when
  ``linear_before_reset=1``); optional.

``direction`` is ONNX's: ``forward``, ``reverse`` (the steps run from ``T-1`` down to 0; ``y[t]`` is
still the state after step ``t``) or ``bidirectional`` (direction 0 forward, 1 reverse). Only ONNX's
default activations (Sigmoid, Tanh) are defined here; the importer unrolls other activations with
:func:`unroll`, which is also the ops' decomposition (the ``common_ir`` path of every backend that
does not claim them). f32 and f64 only: half types unroll too (their per-step storage rounding is
not what one fused op would give).

**Tolerance.** Each step adds the rounding of an ``H``-term dot product and of the gate functions
(which a backend may compute with its own ``exp``: ``accuracy="library"``) to the state; through
the recurrence those errors add up over ``T`` steps (the gates are contractions: sigmoid' <= 1/4,
tanh' <= 1), so ``condition`` gives ``k = T*(H + 24)`` roundings at the magnitude of the largest
gate pre-activation or cell state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...dtypes import DType
from ...errors import ShapeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType
from ._common import check_dtypes, same_dtype

#: Dtypes of the fused ops (half types unroll: see the module doc).
SCAN_DTYPES = (DType.F32, DType.F64)
#: Gates per step and the default activations (ONNX's) of each recurrent kind.
GATES = {"rnn": 1, "gru": 3, "lstm": 4}
DEFAULT_ACTS: Mapping[str, tuple[str, ...]] = {"rnn": ("tanh",), "gru": ("sigmoid", "tanh"),
                                              "lstm": ("sigmoid", "tanh", "tanh")}


#: ONNX's direction attribute values; ``bidirectional`` has two directions.
DIRECTIONS = ("forward", "reverse", "bidirectional")


def num_directions(attrs: Mapping[str, Any]) -> int:
    return 2 if attrs.get("direction", "forward") == "bidirectional" else 1


def reversed_direction(attrs: Mapping[str, Any], d: int) -> bool:
    """Whether direction ``d`` runs from the last step to the first."""
    return attrs.get("direction", "forward") == "reverse" or d == 1


# -- shape inference -------------------------------------------------------------------------------

def _want(op: str, what: str, t: TensorType, shape: tuple[Any, ...], fix: str) -> None:
    if tuple(t.shape) != shape:
        raise ShapeError(f"op {op!r}: {what} has shape {list(t.shape)}, not {list(shape)}", fix=fix)


def _check(op: str, ts: Sequence[TensorType], gates: int, attrs: Attrs) -> tuple[DType, Any, Any, int, int]:
    """``(dtype, T, B, H, D)`` after checking the operand shapes of a scan op."""
    check_dtypes(op, ts, SCAN_DTYPES)
    dt = same_dtype(op, ts)
    xw, r, h0 = ts[0], ts[1], ts[2]
    nd = num_directions(attrs)
    if r.rank != 3 or not isinstance(r.shape[2], int) or tuple(r.shape[:2]) != (nd, gates * r.shape[2]):
        raise ShapeError(f"op {op!r}: r has shape {list(r.shape)}, not [D, {gates}*H, H] with D = {nd} "
                         f"(direction {attrs.get('direction')!r})",
                         fix=f"pass ONNX's R, [num_directions, {gates}*hidden, hidden]")
    h = r.shape[2]
    if xw.rank != 3 or xw.shape[2] != nd * gates * h:
        raise ShapeError(f"op {op!r}: xw has shape {list(xw.shape)}, not [T, B, {nd * gates * h}]",
                         fix="pass the input projection x @ W.T + biases of every step and direction, "
                             f"[seq, batch, num_directions*{gates}*hidden]")
    t, b = xw.shape[0], xw.shape[1]
    if isinstance(t, int) and t < 1:
        raise ShapeError(f"op {op!r}: the sequence is empty (T = {t})", fix="run at least one step")
    _want(op, "h0", h0, (nd, b, h), "pass the initial hidden state, [num_directions, batch, hidden]")
    return dt, t, b, h, nd


def _infer_lstm(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if len(ts) not in (4, 5):
        raise ShapeError(f"op 'lstm_scan' takes 4 or 5 inputs (xw, r, h0, c0[, p]), got {len(ts)}",
                         fix="pass the peepholes p [D, 3H] as the 5th input, or nothing")
    dt, t, b, h, nd = _check("lstm_scan", ts, 4, attrs)
    _want("lstm_scan", "c0", ts[3], (nd, b, h),
          "pass the initial cell state, [num_directions, batch, hidden]")
    if len(ts) == 5:
        _want("lstm_scan", "p", ts[4], (nd, 3 * h), "pass ONNX's P (peepholes in the order i, o, f), "
                                                    "[num_directions, 3*hidden]")
    state = TensorType(dt, (nd, b, h))
    return [TensorType(dt, (t, nd, b, h)), state, state]


def _infer_gru(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if len(ts) not in (3, 4):
        raise ShapeError(f"op 'gru_scan' takes 3 or 4 inputs (xw, r, h0[, rb]), got {len(ts)}",
                         fix="pass the candidate's recurrent bias rb [D, H] as the 4th input, or nothing")
    dt, t, b, h, nd = _check("gru_scan", ts, 3, attrs)
    if len(ts) == 4:
        _want("gru_scan", "rb", ts[3], (nd, h), "pass the recurrent bias of the hidden (candidate) gate, "
                                                "ONNX's Rbh, [num_directions, hidden]")
    return [TensorType(dt, (t, nd, b, h)), TensorType(dt, (nd, b, h))]


# -- float64 references -----------------------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(1.0 / (1.0 + np.exp(-x)))


def _steps(t: int, reverse: bool) -> range:
    return range(t - 1, -1, -1) if reverse else range(t)


def lstm_reference(xw: np.ndarray, r: np.ndarray, h0: np.ndarray, c0: np.ndarray, p: np.ndarray | None,
                   reverse: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One direction: ``xw [T,B,4H]``, ``r [4H,H]``, ``h0``, ``c0`` ``[B,H]``, ``p [3H]`` or None."""
    xw, r = np.asarray(xw, np.float64), np.asarray(r, np.float64)
    h, c = np.array(h0, np.float64), np.array(c0, np.float64)
    hid = r.shape[1]
    pi, po, pf = (np.zeros(hid),) * 3 if p is None else np.split(np.asarray(p, np.float64), 3)
    y = np.empty(xw.shape[:2] + (hid,))
    for t in _steps(xw.shape[0], reverse):
        gi, go, gf, gc = np.split(xw[t] + h @ r.T, 4, axis=-1)
        i, f = _sigmoid(gi + pi * c), _sigmoid(gf + pf * c)
        c = f * c + i * np.tanh(gc)
        h = _sigmoid(go + po * c) * np.tanh(c)
        y[t] = h
    return y, h, c


def gru_reference(xw: np.ndarray, r: np.ndarray, h0: np.ndarray, rb: np.ndarray | None, lbr: bool,
                  reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """One direction: ``xw [T,B,3H]``, ``r [3H,H]``, ``h0 [B,H]``, ``rb [H]`` or None."""
    xw, r = np.asarray(xw, np.float64), np.asarray(r, np.float64)
    h = np.array(h0, np.float64)
    hid = r.shape[1]
    rbh = np.zeros(hid) if rb is None else np.asarray(rb, np.float64)
    rz, rr, rh = r[:hid], r[hid:2 * hid], r[2 * hid:]
    y = np.empty(xw.shape[:2] + (hid,))
    for t in _steps(xw.shape[0], reverse):
        xz, xr, xh = np.split(xw[t], 3, axis=-1)
        z, rg = _sigmoid(xz + h @ rz.T), _sigmoid(xr + h @ rr.T)
        n = np.tanh(xh + rg * (h @ rh.T + rbh)) if lbr else np.tanh(xh + (rg * h) @ rh.T + rbh)
        h = (1.0 - z) * n + z * h
        y[t] = h
    return y, h


def _per_direction(xs: Sequence[Any], attrs: Attrs, one: Callable[..., tuple[np.ndarray, ...]]
                   ) -> list[np.ndarray]:
    """Run ``one(xw_d, r_d, states_d..., extra_d, reverse)`` per direction and stack as ONNX does."""
    xw = np.asarray(xs[0], np.float64)
    nd, gh = num_directions(attrs), np.asarray(xs[1]).shape[1]
    outs = []
    for d in range(nd):
        rest = [np.asarray(x)[d] for x in xs[2:]]
        outs.append(one(xw[..., d * gh:(d + 1) * gh], np.asarray(xs[1])[d], *rest,
                        reverse=reversed_direction(attrs, d)))
    y = np.stack([o[0] for o in outs], axis=1)
    return [y] + [np.stack([o[k] for o in outs], axis=0) for k in range(1, len(outs[0]))]


def _ref_lstm(xs: Sequence[Any], attrs: Attrs) -> list[np.ndarray]:
    def one(xw: Any, r: Any, h0: Any, c0: Any, p: Any = None, *, reverse: bool) -> tuple[np.ndarray, ...]:
        return lstm_reference(xw, r, h0, c0, p, reverse)
    return _per_direction(xs, attrs, one)


def _ref_gru(xs: Sequence[Any], attrs: Attrs) -> list[np.ndarray]:
    lbr = bool(attrs["linear_before_reset"])

    def one(xw: Any, r: Any, h0: Any, rb: Any = None, *, reverse: bool) -> tuple[np.ndarray, ...]:
        return gru_reference(xw, r, h0, rb, lbr, reverse)
    return _per_direction(xs, attrs, one)


# -- decomposition: the unrolled recurrence ---------------------------------------------------------

Act = Callable[[Any], Any]


def _cols(g: Any, x: Any, k: int, h: int) -> Any:
    """Gate ``k`` of ``x`` (columns ``k*h : (k+1)*h`` of the last axis)."""
    return g.op("slice", x, starts=(k * h,), stops=((k + 1) * h,), axes=(x.rank - 1,))


def unroll(g: Any, kind: str, xw: Any, r: Any, h0: Any, c0: Any = None, *, p: Any = None, rb: Any = None,
           lbr: bool = False, reverse: bool = False, acts: Sequence[str] | None = None
           ) -> tuple[Any, Any, Any]:
    """The recurrence written out step by step with the builder ``g``: ``(y [T,B,H], h_T, c_T)``
    (``c_T`` None but for LSTM). ``kind`` is ``rnn``, ``gru`` or ``lstm``; operands as in the module
    doc (an RNN's ``xw`` is ``[T,B,H]`` with both biases folded in, ``r`` ``[H,H]``); ``acts`` names
    each activation (``sigmoid``, ``tanh``, ``relu``; default ONNX's). One ``matmul`` per step (two
    for a GRU with ``linear_before_reset=0``): the decomposition of ``lstm_scan``/``gru_scan`` and
    what the ONNX importer emits for what those ops do not cover."""
    names = tuple(acts) if acts is not None else DEFAULT_ACTS[kind]
    fs: list[Act] = [(lambda op: (lambda x: g.op(op, x)))(a) for a in names]
    t_len, batch = xw.shape[0], xw.shape[1]
    if not isinstance(t_len, int):
        raise ShapeError(f"{kind}_scan over the symbolic sequence length {t_len!r} cannot be unrolled",
                         fix="bind the sequence length (specialise the graph) first")
    hid = r.shape[1]
    n_g = GATES[kind]
    rt = g.op("transpose", r, perm=(1, 0))  # [H, G*H]
    h, c = h0, c0
    outs: dict[int, Any] = {}
    for t in _steps(t_len, reverse):
        xt = g.op("reshape", g.op("slice", xw, starts=(t,), stops=(t + 1,), axes=(0,)),
                  shape=(batch, n_g * hid))
        if kind == "rnn":
            h = fs[0](xt + g.op("matmul", h, rt))
        elif kind == "gru":
            h = _gru_step(g, xt, h, rt, rb, hid, fs, lbr)
        else:
            h, c = _lstm_step(g, xt + g.op("matmul", h, rt), c, p, hid, fs)
        outs[t] = h
    parts = [g.op("reshape", outs[t], shape=(1, batch, hid)) for t in range(t_len)]
    y = parts[0] if len(parts) == 1 else g.op("concat", *parts, axis=0)
    return y, h, c


def _gru_step(g: Any, xt: Any, hp: Any, rt: Any, rb: Any, h: int, fs: Sequence[Act], lbr: bool) -> Any:
    f, gfn = fs
    hr = g.op("matmul", hp, _cols(g, rt, 0, 2 * h) if not lbr else rt)  # [B, 2H or 3H]
    z = f(_cols(g, xt, 0, h) + _cols(g, hr, 0, h))
    rg = f(_cols(g, xt, 1, h) + _cols(g, hr, 1, h))
    if not lbr:  # (r * h_prev) @ Rh^T + Rbh
        inner = g.op("matmul", rg * hp, _cols(g, rt, 2, h))
        if rb is not None:
            inner = inner + rb
    else:  # r * (h_prev @ Rh^T + Rbh)
        hh = _cols(g, hr, 2, h)
        inner = rg * (hh + rb if rb is not None else hh)
    cand = gfn(_cols(g, xt, 2, h) + inner)
    one = g.const(1, xt.dtype)
    return (one - z) * cand + z * hp


def _lstm_step(g: Any, gates: Any, cp: Any, peep: Any, h: int, fs: Sequence[Act]) -> tuple[Any, Any]:
    f, gfn, hfn = fs
    gi, go, gf, gc = (_cols(g, gates, k, h) for k in range(4))  # ONNX's gate order: i, o, f, c
    if peep is not None:  # P is [3h] in the order i, o, f
        gi = gi + _cols(g, peep, 0, h) * cp
        gf = gf + _cols(g, peep, 2, h) * cp
    i, fg = f(gi), f(gf)
    c = fg * cp + i * gfn(gc)
    if peep is not None:
        go = go + _cols(g, peep, 1, h) * c
    return f(go) * hfn(c), c


def _direction(g: Any, x: Any, d: int) -> Any:
    """``x[d]`` of a ``[D, ...]`` tensor."""
    part = g.op("slice", x, starts=(d,), stops=(d + 1,), axes=(0,))
    return g.op("reshape", part, shape=tuple(x.shape[1:]))


def _stack(g: Any, parts: Sequence[Any], axis: int) -> Any:
    """Per-direction results stacked on a new axis ``axis`` (ONNX's num_directions axis)."""
    shaped = [g.op("reshape", p, shape=(*p.shape[:axis], 1, *p.shape[axis:])) for p in parts]
    return shaped[0] if len(shaped) == 1 else g.op("concat", *shaped, axis=axis)


def _dec(kind: str, g: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    xw, r = ins[0], ins[1]
    gh = r.shape[1]
    lbr = bool(attrs.get("linear_before_reset", False))
    ys, hs, cs = [], [], []
    for d in range(num_directions(attrs)):
        xd = g.op("slice", xw, starts=(d * gh,), stops=((d + 1) * gh,), axes=(2,)) \
            if num_directions(attrs) > 1 else xw
        extra = _direction(g, ins[-1], d) if len(ins) > (4 if kind == "lstm" else 3) else None
        y, h, c = unroll(g, kind, xd, _direction(g, r, d), _direction(g, ins[2], d),
                         _direction(g, ins[3], d) if kind == "lstm" else None,
                         p=extra if kind == "lstm" else None, rb=extra if kind == "gru" else None,
                         lbr=lbr, reverse=reversed_direction(attrs, d))
        ys.append(y)
        hs.append(h)
        cs.append(c)
    outs = [_stack(g, ys, 1), _stack(g, hs, 0)]
    return outs + ([_stack(g, cs, 0)] if kind == "lstm" else [])


def _dec_lstm(g: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    return _dec("lstm", g, ins, attrs)


def _dec_gru(g: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    return _dec("gru", g, ins, attrs)


# -- cost and tolerance -----------------------------------------------------------------------------

def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    # per step, batch row and gate element: the recurrent product (a multiply-add per hidden unit)
    # and ~10 flops of gate arithmetic and transcendentals
    hid = ins[1].shape[2]
    return float(ins[0].numel()) * (2 * (hid if isinstance(hid, int) else 1) + 10)


def _amax(x: Any) -> float:
    """The largest finite ``|x|`` (0 if none): non-finite outputs are compared exactly anyway."""
    a = np.abs(np.asarray(x, np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def _condition(kind: str) -> Callable[[Sequence[np.ndarray], Attrs], tuple[int, float]]:
    def condition(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
        xw, r, h0 = (np.asarray(x, np.float64) for x in xs[:3])
        cells = 0.0
        if kind == "lstm":
            with np.errstate(all="ignore"):
                c = _ref_lstm(xs, attrs)[2]
            cells = max(_amax(xs[3]), _amax(c))
        # a gate pre-activation: its share of xw plus an H-term product of |h| <= max(1, |h0|)
        pre = _amax(xw) + _amax(np.sum(np.abs(r), axis=2)) * max(1.0, _amax(h0))
        return int(xw.shape[0]) * (int(r.shape[2]) + 24), max(1.0, pre, cells)
    return condition


# amp="f32": under autocast the recurrence stays in f32 (its state accumulates over every step).
_COMMON: dict[str, Any] = dict(level="hir", category="recurrent", dtypes=SCAN_DTYPES, accumulates=True,
                               accuracy="library", amp="f32", cases=CaseSpec("recurrent"))

_DIRECTION = AttrSpec("direction", "str", "forward", "ONNX's direction: forward, reverse (last step first) "
                      "or bidirectional (two directions, the second reversed)", choices=DIRECTIONS)

register_op(OpSchema(
    "lstm_scan", ("xw", "r", "h0", "c0", "p*"), _infer_lstm, _ref_lstm, attrs=(_DIRECTION,),
    num_outputs=3, flops=_flops, decompose=_dec_lstm, extra={"condition": _condition("lstm")}, **_COMMON,
    doc="an ONNX LSTM layer past its input projection (gate order i, o, f, c; Sigmoid/Tanh): xw [T,B,D*4H] "
        "(x @ W.T + biases), r [D,4H,H], h0, c0 [D,B,H], optional peepholes p [D,3H] -> y [T,D,B,H], "
        "h_T, c_T [D,B,H]"))

register_op(OpSchema(
    "gru_scan", ("xw", "r", "h0", "rb*"), _infer_gru, _ref_gru,
    attrs=(_DIRECTION,
           AttrSpec("linear_before_reset", "bool", False, "apply the reset gate after the recurrent "
                    "product of the candidate (ONNX linear_before_reset=1, PyTorch's GRU)")),
    num_outputs=2, flops=_flops, decompose=_dec_gru, extra={"condition": _condition("gru")}, **_COMMON,
    doc="an ONNX GRU layer past its input projection (gate order z, r, h; Sigmoid/Tanh): xw [T,B,D*3H] "
        "(x @ W.T + foldable biases), r [D,3H,H], h0 [D,B,H], optional candidate recurrent bias rb [D,H] "
        "-> y [T,D,B,H], h_T [D,B,H]"))
