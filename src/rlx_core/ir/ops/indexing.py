"""Indexing HIR ops with data-dependent selection: ``scatter_reduce`` and ``topk_indices``.

Both are HIR (model-level) ops with an exact decomposition into MIR, so every backend runs them; the
decompositions compare every update (element) with every target position, which costs
``O(updates * axis)`` (``O(n^2)`` per row for top-k) elements, so a backend that runs them often claims
them natively (rlx-cpu does, with NumPy: ``np.maximum.at`` & co. and a stable ``argsort``).

* ``scatter_reduce(x, indices, updates; axis, reduction)``: ONNX ScatterElements. ``reduction`` is
  ``none`` (the *last* of duplicate indices wins, as ONNX Runtime's sequential loop), ``add``,
  ``mul``, ``max`` or ``min``; indices follow ONNX's range rule (``rlx_core.ir.indices``).
* ``topk_indices(x; k, axis, largest)``: the positions of the k largest (smallest) elements along
  ``axis``, sorted, equal values by lower position first (ONNX TopK); NaN counts as larger than
  every number. The values are ``x`` gathered at them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...dtypes import FLOAT_DTYPES, INDEX_DTYPES, INT_DTYPES, WIDE_UINT_DTYPES, DType
from ...errors import DTypeError, ShapeError
from ..indices import normalize as normalize_indices
from ..schema import REGISTRY, AttrSpec, IndexInput, OpSchema, register_op
from ..types import Attrs, TensorType, normalize_axis

REAL = FLOAT_DTYPES + INT_DTYPES
REDUCTIONS = ("none", "add", "mul", "max", "min")


def _lowest(dt: DType) -> Any:
    return -np.inf if dt.is_float else int(np.iinfo(dt.np).min)


def _highest(dt: DType) -> Any:
    return np.inf if dt.is_float else int(np.iinfo(dt.np).max)


def _static(shape: Sequence[Any], op: str) -> tuple[int, ...]:
    if any(isinstance(d, str) for d in shape):
        raise ShapeError(f"{op} needs static dims to decompose, got {tuple(shape)}",
                         fix="specialize the graph (bind its symbols) first")
    return tuple(int(d) for d in shape)


# -- scatter_reduce ----------------------------------------------------------------------------

def _infer_scatter_reduce(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, idx, upd = ts
    if x.dtype not in REAL:
        raise DTypeError(f"scatter_reduce does not accept {x.dtype}", fix="use a real (float or int) dtype")
    if idx.dtype not in INDEX_DTYPES:
        raise DTypeError(f"scatter_reduce indices are {idx.dtype}", fix="cast indices to i32 or i64")
    if upd.dtype != x.dtype:
        raise DTypeError(f"scatter_reduce updates are {upd.dtype}, data is {x.dtype}",
                         fix="cast updates to the data dtype")
    if idx.shape != upd.shape or idx.rank != x.rank:
        raise ShapeError(f"scatter_reduce: indices {idx.shape} and updates {upd.shape} must have equal "
                         f"shapes and the rank of data {x.shape}", fix="ONNX ScatterElements rules")
    ax = normalize_axis(attrs["axis"], x.rank)  # type: ignore[arg-type]
    for d in range(x.rank):
        a, b = idx.shape[d], x.shape[d]
        if d != ax and isinstance(a, int) and isinstance(b, int) and a > b:
            raise ShapeError(f"scatter_reduce: indices {idx.shape} are larger than data {x.shape} on axis "
                             f"{d}", fix="ONNX ScatterElements rules")
    return [x]


def _ref_scatter_reduce(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    data, idx, upd = xs
    ax = normalize_axis(attrs["axis"], data.ndim)  # type: ignore[arg-type]
    out = data.copy()
    grids: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grids[ax] = normalize_indices(idx, data.shape[ax], what="scatter_reduce", axis=ax)
    at = tuple(np.broadcast_arrays(*grids))
    red = str(attrs["reduction"])
    with np.errstate(all="ignore"):
        if red == "none":
            flat = np.ravel_multi_index(at, data.shape).reshape(-1) if idx.size else np.zeros(0, np.int64)
            # The last update per target wins: keep each target's last occurrence (sequential order).
            _, last = np.unique(flat[::-1], return_index=True)
            keep = flat.size - 1 - last
            out.reshape(-1)[flat[keep]] = upd.reshape(-1)[keep]
        else:
            {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[red].at(out, at, upd)
    return [out]


def _dec_scatter_reduce(g: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """Dense and exact: ``hit[.., j, i, ..] = (index j == i)`` over the updates j and targets i along
    the axis, then per target a max/min/product over the hits (``none``: the update of the largest
    hitting j), combined with x. The indices first pass through a ``gather`` from a zero vector, so
    an index out of range is the gather's error, not a silently dropped update."""
    x, idx, upd = ins
    at = REGISTRY.get("scatter_reduce").check_attrs(attrs, "decomposition of scatter_reduce")
    red = at["reduction"]
    ax = normalize_axis(at["axis"], x.rank)  # type: ignore[arg-type]
    if red == "add":
        return [g.op("scatter_add", x, idx, upd, axis=ax)]
    ds, ish = _static(x.shape, "scatter_reduce"), _static(idx.shape, "scatter_reduce")
    n, m, dt = ds[ax], ish[ax], x.dtype
    i64 = DType.I64
    ii = g.op("cast", idx, to=i64) if idx.dtype is not i64 else idx
    ii = ii + g.op("gather", g.op("expand", g.const(0, i64), shape=(n,)), ii, axis=0)  # range check
    ii = g.op("where", g.op("less", ii, g.const(0, i64)), ii + g.const(n, i64), ii)
    pre, post = ish[:ax], ish[ax + 1:]
    col = (*pre, m, 1, *post)
    hit = g.op("equal", g.op("reshape", ii, shape=col),
               g.op("iota", shape=(*[1] * len(pre), 1, n, *[1] * len(post)), axis=ax + 1, dtype=i64))
    u = g.op("reshape", upd, shape=col)
    region = (*pre, n, *post)
    xr = x if region == ds else g.op("slice", x, starts=(0,) * len(ds), stops=region,
                                      axes=tuple(range(len(ds))))
    if red in ("max", "min"):
        fill = g.const(_lowest(dt) if red == "max" else _highest(dt), dt)
        r = g.op(f"reduce_{red}", g.op("where", hit, u, fill), axes=(ax,), keepdims=False)
        out = g.op("maximum" if red == "max" else "minimum", xr, r)
    elif red == "mul":
        out = xr * g.op("reduce_prod", g.op("where", hit, u, g.const(1, dt)), axes=(ax,), keepdims=False)
    else:  # none: the last hitting update wins
        j = g.op("iota", shape=(*[1] * len(pre), m, 1, *[1] * len(post)), axis=ax, dtype=i64)
        win = g.op("reduce_max", g.op("where", hit, j, g.const(-1, i64)), axes=(ax,), keepdims=True)
        sel = g.op("logical_and", hit, g.op("equal", j, win))
        val = g.op("reduce_max", g.op("where", sel, u, g.const(_lowest(dt), dt)), axes=(ax,), keepdims=False)
        got = g.op("greater_equal", g.op("reshape", win, shape=region), g.const(0, i64))
        out = g.op("where", got, val, xr)
    # Positions past the indices' extent (off the axis) keep x: append them back axis by axis.
    done = list(region)
    for d in range(len(ds)):
        if d == ax or region[d] == ds[d]:
            continue
        starts = [0] * len(ds)
        starts[d] = region[d]
        stops = [done[k] if k != d else ds[d] for k in range(len(ds))]
        for k in range(d + 1, len(ds)):
            stops[k] = region[k]
        rest = g.op("slice", x, starts=tuple(starts), stops=tuple(stops), axes=tuple(range(len(ds))))
        out = g.op("concat", out, rest, axis=d)
        done[d] = ds[d]
    return [out]


register_op(OpSchema(
    "scatter_reduce", ("x", "indices", "updates"), _infer_scatter_reduce, _ref_scatter_reduce,
    attrs=(AttrSpec("axis", "int", default=0),
           AttrSpec("reduction", "str", default="none", choices=REDUCTIONS,
                    doc="none (last duplicate wins), add, mul, max or min")),
    level="hir", category="movement", dtypes=REAL, decompose=_dec_scatter_reduce,
    index_inputs=(IndexInput(1),), flops=lambda i, o, a: float(i[2].numel()), differentiable=False,
    doc="ONNX ScatterElements: out = x; out[.., indices[j], ..] = reduce(out[..], updates[j]) along "
        "axis; reduction none (the last of duplicate indices wins), add, mul, max or min. Indices follow "
        "ONNX: valid in [-n, n-1], a negative one counts from the end once, anything else is an error"))


# -- topk_indices ------------------------------------------------------------------------------

#: ONNX TopK takes every real type, u16/u32/u64 included (its decomposition only compares).
_TOPK_DTYPES = REAL + WIDE_UINT_DTYPES


def _infer_topk(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    if x.dtype not in _TOPK_DTYPES:
        raise DTypeError(f"topk_indices does not accept {x.dtype}", fix="use a real (float or int) dtype")
    if x.rank == 0:
        raise ShapeError("topk_indices needs rank >= 1", fix="reshape the scalar to [1]")
    ax = normalize_axis(attrs["axis"], x.rank)  # type: ignore[arg-type]
    k, n = int(attrs["k"]), x.shape[ax]  # type: ignore[arg-type]
    if k < 0 or (isinstance(n, int) and k > n):
        raise ShapeError(f"topk_indices k={k} is outside [0, {n}] (axis {ax} of {x.shape})",
                         fix="choose k no larger than the axis")
    return [TensorType(DType.I64, x.shape[:ax] + (k,) + x.shape[ax + 1:])]


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Positions along ``axis`` in top-k order: by value (largest or smallest first; NaN the largest),
    equal values by lower position first. The one definition the reference and rlx-cpu share."""
    xm = np.moveaxis(x, axis, -1)
    flat = xm.reshape(-1, xm.shape[-1]) if xm.shape[-1] else xm.reshape(-1, 0)
    pos = np.arange(flat.shape[-1])
    out = np.empty(flat.shape, np.int64)
    for r in range(flat.shape[0]):
        v = flat[r]
        if v.dtype.kind in "iub":
            # ~v is decreasing in v for signed and unsigned integers alike (-v would wrap).
            out[r] = np.argsort(np.invert(v) if largest else v, kind="stable")
            continue
        nan = np.isnan(v)
        filled = np.where(nan, 0, v)
        # lexsort: the last key is the primary one.
        out[r] = np.lexsort((pos, -filled, ~nan)) if largest else np.lexsort((pos, filled, nan))
    return np.moveaxis(out.reshape(xm.shape), -1, axis)


def _ref_topk(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    order = topk_order(x, ax, bool(attrs["largest"]))
    return [np.take(order, np.arange(int(attrs["k"])), axis=ax)]  # type: ignore[arg-type]


def _dec_topk(g: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """``rank[i] = #{j before i}`` (j before i: larger (smaller) value, NaN largest, or equal value
    and j < i), then output slot p holds the i whose rank is p: ``O(n^2)`` per row, exact."""
    (x,) = ins
    at = REGISTRY.get("topk_indices").check_attrs(attrs, "decomposition of topk_indices")
    ax = normalize_axis(at["axis"], x.rank)  # type: ignore[arg-type]
    k, largest = int(at["k"]), bool(at["largest"])  # type: ignore[arg-type]
    shape = _static(x.shape, "topk_indices")
    n, i64 = shape[ax], DType.I64
    r = len(shape)
    perm = tuple(d for d in range(r) if d != ax) + (ax,)
    xt = x if perm == tuple(range(r)) else g.op("transpose", x, perm=perm)
    lead = tuple(shape[d] for d in perm[:-1])
    xi = g.op("reshape", xt, shape=(*lead, 1, n))   # x_i along the last axis
    xj = g.op("reshape", xt, shape=(*lead, n, 1))   # x_j along the second-to-last
    nan_i, nan_j = g.op("not_equal", xi, xi), g.op("not_equal", xj, xj)
    beats = g.op("greater" if largest else "less", xj, xi)
    nan_first = g.op("logical_and", nan_j, g.op("logical_not", nan_i)) if largest else \
        g.op("logical_and", nan_i, g.op("logical_not", nan_j))
    same = g.op("logical_or", g.op("equal", xj, xi), g.op("logical_and", nan_i, nan_j))
    jpos = g.op("iota", shape=(n, n), axis=0, dtype=i64)
    ipos = g.op("iota", shape=(n, n), axis=1, dtype=i64)
    tie = g.op("logical_and", same, g.op("less", jpos, ipos))
    before = g.op("logical_or", g.op("logical_or", beats, nan_first), tie)
    rank = g.op("reduce_sum", g.op("cast", before, to=i64), axes=(len(lead),), keepdims=False)  # (*lead, n)
    slot = g.op("iota", shape=(k, 1), axis=0, dtype=i64)
    sel = g.op("equal", g.op("reshape", rank, shape=(*lead, 1, n)), slot)  # (*lead, k, n)
    idx = g.op("reduce_sum", g.op("where", sel, g.op("iota", shape=(1, n), axis=1, dtype=i64),
                                  g.const(0, i64)), axes=(len(lead) + 1,), keepdims=False)  # (*lead, k)
    if perm == tuple(range(r)):
        return [idx]
    inv = tuple(perm.index(d) for d in range(r))
    return [g.op("transpose", idx, perm=inv)]


register_op(OpSchema(
    "topk_indices", ("x",), _infer_topk, _ref_topk,
    attrs=(AttrSpec("k", "int"), AttrSpec("axis", "int", default=-1),
           AttrSpec("largest", "bool", default=True)),
    level="hir", category="reduction", dtypes=_TOPK_DTYPES, decompose=_dec_topk, differentiable=False,
    flops=lambda i, o, a: float(i[0].numel()), accuracy="exact",
    doc="positions of the k largest (largest=False: smallest) elements along axis, sorted; equal values "
        "by lower position first; NaN counts as the largest value (ONNX TopK's indices; its values are x "
        "gathered at them)"))


__all__ = ["REDUCTIONS", "topk_order"]
