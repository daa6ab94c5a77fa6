"""The reduction MIR ops: ``reduce_sum``/``prod``/``mean``/``max``/``min`` and ``argmax``/``argmin``.

Each op is declared ONCE here with every fact the core knows about it: dtypes and inference, the
float64 reference, its reverse/forward autodiff rules, its ``vmap`` rule, its AMP class, its fusion
class, whether it accumulates (the conformance tolerance of a sum of ``k`` terms), how the
conformance suite feeds it and its tolerance class.

Semantics follow NumPy in float64: integer sums and products wrap, ``reduce_max``/``reduce_min``
propagate NaN and reject an empty reduced axis (no identity), ``argmax``/``argmin`` give the first
extreme index as i64 (NaN counts as extreme). Gradients follow PyTorch: ``reduce_max``/``min``
share the cotangent equally among all extreme elements; ``reduce_prod`` is exact where some
elements are 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...dtypes import DType
from ...errors import ShapeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, Dim, TensorType, normalize_axis
from ._common import FLOATS_C, NUMERIC, NUMERIC_U, REAL, REAL_U, check_dtypes
from .elementwise import ZERO

Rule = Callable[..., list]


def _axes(attrs: Attrs, rank: int) -> tuple[int, ...]:
    axes = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    norm = tuple(sorted({normalize_axis(a, rank) for a in axes}))  # type: ignore[union-attr, arg-type]
    if len(norm) != len(axes):  # type: ignore[arg-type]
        raise ShapeError(f"reduction axes {axes} repeat an axis", fix="list each axis once")
    return norm


def _reduce_shape(t: TensorType, axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return tuple(d for i, d in enumerate(t.shape) if i not in axes)


_RED_ATTRS = (AttrSpec("axes", "ints", default=None, doc="axes to reduce; None reduces all"),
              AttrSpec("keepdims", "bool", default=False))


# -- autodiff rules ------------------------------------------------------------------------------
# Rules build MIR nodes with the graph builder they are given; the autodiff helpers are imported
# when a rule runs, so declaring an op does not import the autodiff package.

def _c(b: Any, value: float, like: Any) -> Any:
    return b.const(value, like.dtype)


def _linear_jvp(op: str) -> Rule:
    """Forward mode of an op linear in its input: the op applied to the tangent."""
    def jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
        t = ts[0]
        if t is None or not outs[0].dtype.is_float:
            return [None]
        return [b.op(op, t, **dict(attrs))]
    return jvp


def _sum_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import red_axes, restore_reduced

    x, g = ins[0], cts[0]
    if g is None or not x.dtype.is_float:
        return [None]
    return [restore_reduced(b, g, x, red_axes(attrs, x.rank), bool(attrs["keepdims"]))]


def _mean_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import count, red_axes, restore_reduced

    x, g = ins[0], cts[0]
    if g is None or not x.dtype.is_float:
        return [None]
    axes = red_axes(attrs, x.rank)
    g = g / count(b, x.shape, axes, x.dtype)
    return [restore_reduced(b, g, x, axes, bool(attrs["keepdims"]))]


def _extreme_share(b: Any, x: Any, y: Any, attrs: Attrs) -> Any:
    """mask / count: 1/k on each of the k elements equal to the max (min), 0 elsewhere."""
    from ...autodiff._util import red_axes, restore_reduced

    axes = red_axes(attrs, x.rank)
    yk = restore_reduced(b, y, x, axes, bool(attrs["keepdims"]), expand=False)
    mask = b.op("cast", b.op("equal", x, yk), to=x.dtype)
    return mask / b.op("reduce_sum", mask, axes=axes, keepdims=True)


def _extreme_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import red_axes, restore_reduced

    x, g = ins[0], cts[0]
    if g is None or not x.dtype.is_float:
        return [None]
    axes = red_axes(attrs, x.rank)
    gk = restore_reduced(b, g, x, axes, bool(attrs["keepdims"]), expand=False)
    return [_extreme_share(b, x, outs[0], attrs) * gk]


def _extreme_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import red_axes

    x, t = ins[0], ts[0]
    if t is None or not x.dtype.is_float:
        return [None]
    share = _extreme_share(b, x, outs[0], attrs)
    return [b.op("reduce_sum", t * share, axes=red_axes(attrs, x.rank), keepdims=bool(attrs["keepdims"]))]


def _prod_partials(b: Any, x: Any, axes: Sequence[int]) -> Any:
    """d prod / d x_i = the product of the other elements, exact when some x are 0."""
    z = _c(b, 0.0, x)
    one = _c(b, 1.0, x)
    is0 = b.op("equal", x, z)
    nz = b.op("where", is0, one, x)
    p = b.op("reduce_prod", nz, axes=tuple(axes), keepdims=True)
    zc = b.op("reduce_sum", b.op("cast", is0, to=x.dtype), axes=tuple(axes), keepdims=True)
    at_zero = b.op("where", b.op("equal", zc, one), p, z)
    elsewhere = b.op("where", b.op("equal", zc, z), p / nz, z)
    return b.op("where", is0, at_zero, elsewhere)


def _prod_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import red_axes, restore_reduced

    x, g = ins[0], cts[0]
    if g is None or not x.dtype.is_float:
        return [None]
    axes = red_axes(attrs, x.rank)
    gk = restore_reduced(b, g, x, axes, bool(attrs["keepdims"]), expand=False)
    return [gk * _prod_partials(b, x, axes)]


def _prod_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import red_axes

    x, t = ins[0], ts[0]
    if t is None or not x.dtype.is_float:
        return [None]
    axes = red_axes(attrs, x.rank)
    return [b.op("reduce_sum", t * _prod_partials(b, x, axes), axes=axes, keepdims=bool(attrs["keepdims"]))]


# -- vmap rules (the batch is a new leading axis 0: reduction axes shift by one) -----------------

def _shift(axis: Any, rank: int) -> int:
    return normalize_axis(int(axis), rank) + 1


def _reduction_batch(op: str) -> Callable[..., Any]:
    def rule(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
        x = ins[0]
        r = x.rank - 1
        axes = attrs["axes"]
        new = tuple(range(1, r + 1)) if axes is None else tuple(_shift(a, r) for a in axes)  # type: ignore[union-attr]
        return [b.op(op, x, axes=new, keepdims=attrs["keepdims"])], [True]
    return rule


def _arg_batch(op: str) -> Callable[..., Any]:
    def rule(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
        a = dict(attrs)
        a["axis"] = _shift(a["axis"], ins[0].rank - 1)
        return [b.op(op, *ins, **a)], [True]
    return rule


# -- declarations --------------------------------------------------------------------------------

def reduction(name: str, fn: Any, dtypes: Sequence[DType], doc: str, *, grad: tuple[Rule, Rule],
              nonempty: bool = False, amp: str | None = None, accumulates: bool = False,
              domain: str = "default", accuracy: str | None = None) -> OpSchema:
    """Declare and register an ``axes``/``keepdims`` reduction ``y = fn(x, axis=axes)``
    (``nonempty``: reducing an empty axis is an error, the op has no identity)."""
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(name, ts, dtypes)
        axes = _axes(attrs, ts[0].rank)
        if nonempty and any(ts[0].shape[a] == 0 for a in axes):
            raise ShapeError(f"{name} over an empty axis has no identity",
                             fix="reduce only non-empty axes")
        return [TensorType(ts[0].dtype, _reduce_shape(ts[0], axes, bool(attrs["keepdims"])))]

    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        axes = _axes(attrs, xs[0].ndim)
        with np.errstate(all="ignore"):
            return [np.asarray(fn(xs[0], axis=axes, keepdims=bool(attrs["keepdims"])))]

    vjp, jvp = grad
    return register_op(OpSchema(
        name, ("x",), infer, ref, attrs=_RED_ATTRS, category="reduction", doc=doc,
        dtypes=tuple(dtypes), fusion="reduction", amp=amp, flops=lambda i, o, a: float(i[0].numel()),
        vjp=vjp, jvp=jvp, batch=_reduction_batch(name), accumulates=accumulates,
        cases=CaseSpec("reduction", (domain,)), accuracy=accuracy))


def arg_reduction(name: str, fn: Any) -> OpSchema:
    """Declare and register an index reduction along ``axis`` (the first extreme, as i64)."""
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(name, ts, REAL)
        ax = normalize_axis(attrs["axis"], ts[0].rank)  # type: ignore[arg-type]
        if ts[0].shape[ax] == 0:
            raise ShapeError(f"{name} over an empty axis", fix="reduce a non-empty axis")
        return [TensorType(DType.I64, _reduce_shape(ts[0], (ax,), bool(attrs["keepdims"])))]

    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        ax = normalize_axis(attrs["axis"], xs[0].ndim)  # type: ignore[arg-type]
        return [np.asarray(fn(xs[0], axis=ax, keepdims=bool(attrs["keepdims"]))).astype(np.int64)]

    vjp, jvp = ZERO
    return register_op(OpSchema(
        name, ("x",), infer, ref, attrs=(AttrSpec("axis", "int", default=-1),
                                         AttrSpec("keepdims", "bool", default=False)),
        category="reduction", dtypes=REAL, differentiable=False, vjp=vjp, jvp=jvp,
        batch=_arg_batch(name), cases=CaseSpec("arg", ("ties",)), accuracy="exact",
        doc=f"index of the first {name[3:]} along axis (i64); NaN counts as extreme"))


# Sums and products run in f32 under autocast (accumulation error grows with the count).
reduction("reduce_sum", np.sum, NUMERIC_U, "sum over axes (integers wrap)", amp="f32", accumulates=True,
          grad=(_sum_vjp, _linear_jvp("reduce_sum")))
reduction("reduce_prod", np.prod, NUMERIC, "product over axes", amp="f32", accumulates=True,
          grad=(_prod_vjp, _prod_jvp), domain="unit")
reduction("reduce_mean", np.mean, FLOATS_C, "mean over axes", amp="f32", accumulates=True,
          grad=(_mean_vjp, _linear_jvp("reduce_mean")))
reduction("reduce_max", np.max, REAL_U, "max over axes; NaN propagates", nonempty=True,
          grad=(_extreme_vjp, _extreme_jvp), accuracy="exact")
reduction("reduce_min", np.min, REAL_U, "min over axes; NaN propagates", nonempty=True,
          grad=(_extreme_vjp, _extreme_jvp), accuracy="exact")

arg_reduction("argmax", np.argmax)
arg_reduction("argmin", np.argmin)
