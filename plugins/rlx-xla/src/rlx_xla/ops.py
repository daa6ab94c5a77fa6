"""One emitter per claimed op: ``emit(args, attrs, in_types, out_types) -> [jax arrays]``.

Emitters run while JAX traces the program (never per call), so they may use NumPy and Python
freely on static facts (shapes, attributes); what they return are traced ``jax.numpy``/``lax``
values. Every result is cast to the node's inferred dtype by the caller, so an emitter may compute
in a wider type (half precision runs in f32, see :data:`HALF_IN_F32`).

Imported only by :mod:`rlx_xla.lower`, i.e. when a program is compiled: it imports JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from rlx_core.plugin import Attrs, DType, TensorType, normalize_axis, slice_params

Emit = Callable[[list[Any], Attrs, Sequence[TensorType], Sequence[TensorType]], list[Any]]

#: f32 matmuls and convolutions at full f32 precision: XLA's default on GPUs and TPUs is TF32 or
#: bf16 passes, which the float64-referenced tolerances (rightly) reject.
HIGHEST = lax.Precision.HIGHEST

#: Ops computed exactly in storage precision; every other float op on f16/bf16 runs in f32 and is
#: rounded once at the end (as the reference: float64 math, one rounding), so nothing accumulates
#: in half precision on any PJRT platform.
EXACT = frozenset({"reshape", "transpose", "expand", "slice", "concat", "pad", "gather", "where",
                   "cast", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                   "neg", "abs", "maximum", "minimum", "iota", "argmax", "argmin", "sign", "floor",
                   "ceil", "round"})

HALF = (DType.F16, DType.BF16)


def np_dtype(dt: DType) -> Any:
    return dt.np


def _unary(fn: Callable[[Any], Any]) -> Emit:
    return lambda a, attrs, it, ot: [fn(a[0])]


def _binary(fn: Callable[[Any, Any], Any]) -> Emit:
    return lambda a, attrs, it, ot: [fn(a[0], a[1])]


def _div(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x, y = a
    if not it[0].dtype.is_int:
        return [x / y]
    # C semantics (lax.div truncates toward zero); a zero divisor gives 0 as in the reference, and
    # is replaced by 1 first so the device never divides by zero.
    x, y = jnp.broadcast_arrays(x, y)  # lax.div does not broadcast
    zero = y == 0
    q = lax.div(x, jnp.where(zero, jnp.ones_like(y), y))
    return [jnp.where(zero, jnp.zeros_like(q), q)]


def _reciprocal(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    return [jnp.ones_like(a[0]) / a[0]]


def _abs(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    return [jnp.abs(a[0])]


def _cast(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x = a[0]
    src, to = it[0].dtype, ot[0].dtype
    if to is DType.BOOL:
        return [x != 0]
    if src.is_complex and not to.is_complex:
        x = jnp.real(x)
        src = DType.F32
    if to.is_int and src.is_float:
        # Truncation toward zero, as the reference (XLA's convert also truncates; trunc first keeps
        # it exact for half inputs widened on the way).
        x = jnp.trunc(x.astype(jnp.float32) if src in HALF else x)
    return [x.astype(np_dtype(to))]


def _axes(attrs: Attrs, rank: int) -> tuple[int, ...]:
    axes: Any = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted({normalize_axis(int(x), rank) for x in axes}))


def _reduction(fn: Callable[..., Any], typed: bool = True) -> Emit:
    def emit(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
        x = a[0]
        kw: dict[str, Any] = {"dtype": x.dtype} if typed else {}
        return [fn(x, axis=_axes(attrs, x.ndim), keepdims=bool(attrs["keepdims"]), **kw)]
    return emit


def _arg(fn: Callable[..., Any]) -> Emit:
    def emit(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
        x = a[0]
        ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
        return [fn(x, axis=ax, keepdims=bool(attrs["keepdims"]))]
    return emit


def _matmul(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x, y = a
    dt = it[0].dtype
    if dt.is_float:
        return [jnp.matmul(x, y, precision=HIGHEST)]
    return [jnp.matmul(x, y)]


def _reshape(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    return [jnp.reshape(a[0], ot[0].shape)]


def _transpose(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x = a[0]
    perm: Any = attrs["perm"]
    if perm is None:
        perm = tuple(reversed(range(x.ndim)))
    return [jnp.transpose(x, tuple(normalize_axis(int(p), x.ndim) for p in perm))]


def _expand(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    return [jnp.broadcast_to(a[0], ot[0].shape)]


def _slice(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x = a[0]
    if any(d == 0 for d in ot[0].shape):
        return [jnp.zeros(ot[0].shape, x.dtype)]
    idx: list[Any] = [slice(None)] * x.ndim
    for ax, sl in slice_params(attrs, x.shape):
        idx[ax] = sl
    return [x[tuple(idx)]]


def _concat(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    ax = normalize_axis(int(attrs["axis"]), len(ot[0].shape))  # type: ignore[arg-type]
    return [jnp.concatenate(a, axis=ax)]


def _pad(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x = a[0]
    r = x.ndim
    if r == 0:
        return [x]
    pads: Any = attrs["pads"]
    with np.errstate(invalid="ignore", over="ignore"):
        # The fill value converted exactly as the reference does (NumPy's astype to the dtype).
        value = np.asarray(attrs["value"]).astype(np_dtype(it[0].dtype))
    fill = jnp.asarray(value, dtype=x.dtype)
    return [lax.pad(x, fill, [(int(pads[i]), int(pads[i + r]), 0) for i in range(r)])]


def _index_positions(idx: Any, n: int) -> tuple[Any, Any]:
    """ONNX indices: a negative one counts from the end once; returns (clamped positions, valid).
    Kept in the index dtype (64-bit stays 64-bit) so nothing is narrowed before the check."""
    pos = jnp.where(idx < 0, idx + n, idx)
    valid = (pos >= 0) & (pos < n)
    return jnp.clip(pos, 0, max(n - 1, 0)), valid


def _gather(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x, idx = a
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    n = x.shape[ax]
    if any(d == 0 for d in ot[0].shape) or n == 0:
        return [jnp.zeros(ot[0].shape, x.dtype)]
    # An index computed on the device is never checked on the host: out of range gives 0, and the
    # read itself is clamped, so the program never touches memory outside x.
    pos, valid = _index_positions(idx, n)
    got = jnp.take(x, pos, axis=ax, mode="clip")
    mask = valid.reshape((1,) * ax + idx.shape + (1,) * (x.ndim - ax - 1))
    return [jnp.where(mask, got, jnp.zeros((), x.dtype))]


def _scatter_add(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x, idx, upd = a
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    if idx.size == 0:
        return [x]
    n = x.shape[ax]
    pos = jnp.where(idx < 0, idx + n, idx)
    # Out of range (after one wrap) becomes n: dropped by mode="drop", never wrapped again.
    pos = jnp.where((pos < 0) | (pos >= n), n, pos)
    grids: list[Any] = [lax.broadcasted_iota(jnp.int32, idx.shape, d) for d in range(idx.ndim)]
    grids[ax] = pos
    return [x.at[tuple(grids)].add(upd, mode="drop")]


def _scatter_reduce(a: list[Any], attrs: Attrs, it: Sequence[TensorType],
                    ot: Sequence[TensorType]) -> list[Any]:
    x, idx, upd = a
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    if idx.size == 0:
        return [x]
    n = x.shape[ax]
    pos = jnp.where(idx < 0, idx + n, idx)
    pos = jnp.where((pos < 0) | (pos >= n), n, pos)  # out of range: dropped, never wrapped twice
    grids: list[Any] = [lax.broadcasted_iota(jnp.int32, idx.shape, d) for d in range(idx.ndim)]
    grids[ax] = pos
    at = tuple(grids)
    red = str(attrs["reduction"])
    if red == "none":
        # The last update per target wins, deterministically on every platform (XLA leaves the
        # order of colliding scatter writes unspecified): scatter each update's sequence number
        # with max, then gather the winning update.
        order = jnp.arange(idx.size, dtype=jnp.int64).reshape(idx.shape)
        winner = jnp.full(x.shape, -1, jnp.int64).at[at].max(order, mode="drop")
        picked = jnp.take(upd.reshape(-1), jnp.clip(winner, 0, idx.size - 1), mode="clip")
        return [jnp.where(winner >= 0, picked, x)]
    ref = x.at[at]
    fn = {"add": ref.add, "mul": ref.multiply, "max": ref.max, "min": ref.min}[red]
    return [fn(upd, mode="drop")]


def _iota(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    shape = tuple(ot[0].shape)
    if not shape:
        return [jnp.zeros((), jnp.int64)]
    ax = normalize_axis(int(attrs["axis"]), len(shape))  # type: ignore[arg-type]
    # Integers first, then one conversion: the reference's arange(...).astype(dtype).
    return [lax.broadcasted_iota(jnp.int64, shape, ax)]


def _conv2d(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x, w = a
    sh, sw = (int(v) for v in attrs["strides"])  # type: ignore[union-attr]
    pt, pl, pb, pr = (int(v) for v in attrs["pads"])  # type: ignore[union-attr]
    dh, dw = (int(v) for v in attrs["dilations"])  # type: ignore[union-attr]
    kw: dict[str, Any] = {"precision": HIGHEST} if it[0].dtype.is_float else {}
    out = lax.conv_general_dilated(x, w, window_strides=(sh, sw), padding=[(pt, pb), (pl, pr)],
                                   rhs_dilation=(dh, dw), feature_group_count=int(attrs["groups"]),  # type: ignore[arg-type]
                                   dimension_numbers=("NCHW", "OIHW", "NCHW"), **kw)
    return [out]


def _cumsum(a: list[Any], attrs: Attrs, it: Sequence[TensorType], ot: Sequence[TensorType]) -> list[Any]:
    x = a[0]
    if x.ndim == 0:
        return [jnp.zeros_like(x) if attrs["exclusive"] else x]
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    rev = bool(attrs["reverse"])
    src = jnp.flip(x, ax) if rev else x
    out = jnp.cumsum(src, axis=ax, dtype=x.dtype)
    if attrs["exclusive"]:
        out = out - src
    return [jnp.flip(out, ax) if rev else out]


def _erf(x: Any) -> Any:
    return lax.erf(x)


EMITTERS: dict[str, Emit] = {
    "neg": _unary(jnp.negative), "abs": _abs, "sign": _unary(jnp.sign), "exp": _unary(jnp.exp),
    "log": _unary(jnp.log), "sqrt": _unary(jnp.sqrt), "rsqrt": _unary(lax.rsqrt),
    "reciprocal": _reciprocal, "sin": _unary(jnp.sin), "cos": _unary(jnp.cos), "tanh": _unary(jnp.tanh),
    "sigmoid": _unary(lax.logistic), "erf": _unary(_erf), "floor": _unary(jnp.floor),
    "ceil": _unary(jnp.ceil), "round": _unary(jnp.round), "logical_not": _unary(jnp.logical_not),
    "add": _binary(jnp.add), "sub": _binary(jnp.subtract), "mul": _binary(jnp.multiply), "div": _div,
    "pow": _binary(jnp.power), "maximum": _binary(jnp.maximum), "minimum": _binary(jnp.minimum),
    "logical_and": _binary(jnp.logical_and), "logical_or": _binary(jnp.logical_or),
    "logical_xor": _binary(jnp.logical_xor), "equal": _binary(jnp.equal),
    "not_equal": _binary(jnp.not_equal), "less": _binary(jnp.less), "less_equal": _binary(jnp.less_equal),
    "greater": _binary(jnp.greater), "greater_equal": _binary(jnp.greater_equal),
    "where": lambda a, attrs, it, ot: [jnp.where(a[0], a[1], a[2])], "cast": _cast,
    "reduce_sum": _reduction(jnp.sum), "reduce_prod": _reduction(jnp.prod),
    "reduce_mean": _reduction(jnp.mean), "reduce_max": _reduction(jnp.max, False),
    "reduce_min": _reduction(jnp.min, False), "argmax": _arg(jnp.argmax), "argmin": _arg(jnp.argmin),
    "matmul": _matmul, "reshape": _reshape, "transpose": _transpose, "expand": _expand,
    "slice": _slice, "concat": _concat, "pad": _pad, "gather": _gather, "scatter_add": _scatter_add,
    "scatter_reduce": _scatter_reduce,
    "iota": _iota, "conv2d": _conv2d, "cumsum": _cumsum,
}


def emit(op: str, args: list[Any], attrs: Attrs, in_types: Sequence[TensorType],
         out_types: Sequence[TensorType]) -> list[Any]:
    """Lower one step; half-precision float math runs in f32 (see :data:`EXACT`), and every result
    leaves with the node's inferred dtype and shape."""
    fn = EMITTERS[op]
    if op not in EXACT and any(t.dtype in HALF for t in in_types):
        args = [x.astype(jnp.float32) if t.dtype in HALF else x for x, t in zip(args, in_types)]
    outs = fn(args, attrs, in_types, out_types)
    return [o.astype(np_dtype(t.dtype)) if o.dtype != np_dtype(t.dtype) else o
            for o, t in zip(outs, out_types)]
