"""The data-movement MIR ops: ``reshape``, ``transpose``, ``expand``, ``slice``, ``concat``, ``pad``.

Each op is declared ONCE here with every fact the core knows about it: inference, the float64
reference, its reverse/forward autodiff rules, its ``vmap`` rule, how the conformance suite feeds
it and its tolerance class (exact: results are input values). None of them computes, so they have
no AMP class (they run at their operands' dtype) and cost no flops.

Semantics follow NumPy: ``reshape`` keeps the element order (one ``-1`` is inferred), ``transpose``
with no ``perm`` reverses the axes, ``expand`` broadcasts, ``slice`` is Python slicing per axis
(negative indices and steps, clamped), ``pad`` pads with a constant (befores, then afters).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import ShapeError
from .. import symexpr
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, Dim, TensorType, broadcast_shapes, normalize_axis
from ._common import STORAGE
from ._common import same_dtype as _same_dtype

Rule = Callable[..., list]


# -- autodiff rules ------------------------------------------------------------------------------
# Rules build MIR nodes with the graph builder they are given; the autodiff helpers are imported
# when a rule runs, so declaring an op does not import the autodiff package.

def _linear_jvp(op: str, **override: Any) -> Rule:
    """Forward mode of an op linear in its input: the op applied to the tangent."""
    def jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
        t = ts[0]
        if t is None or not outs[0].dtype.is_float:
            return [None]
        return [b.op(op, t, **{**dict(attrs), **override})]
    return jvp


def _reshape_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import reshape

    g = cts[0]
    return [None if g is None or not ins[0].dtype.is_float else reshape(b, g, ins[0].shape)]


def _perm(attrs: Attrs, r: int) -> tuple[int, ...]:
    perm: Any = attrs["perm"]
    return tuple(reversed(range(r))) if perm is None else tuple(normalize_axis(p, r) for p in perm)


def _transpose_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    r = ins[0].rank
    inv = [0] * r
    for i, p in enumerate(_perm(attrs, r)):
        inv[p] = i
    return [b.op("transpose", g, perm=tuple(inv))]


def _expand_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import sum_to

    g = cts[0]
    return [None if g is None or not ins[0].dtype.is_float else sum_to(b, g, ins[0].shape)]


def _slice_transpose(b: Any, g: Any, x: Any, attrs: Attrs) -> Any:
    """Scatter a slice's cotangent back into zeros of ``x``'s shape (any steps, negative too)."""
    from ...autodiff._util import dilate, reverse_axes, take_window, zeros_like

    out = g
    starts: Any = attrs["starts"]
    stops: Any = attrs["stops"]
    n_ax = len(starts)
    axes: Any = attrs["axes"] if attrs["axes"] is not None else tuple(range(n_ax))
    steps: Any = attrs["steps"] if attrs["steps"] is not None else (1,) * n_ax
    for st, sp, a, step in zip(starts, stops, axes, steps):
        ax = normalize_axis(a, x.rank)
        n = x.shape[ax]
        if not isinstance(n, int):
            continue  # only the full slice of a symbolic dim is legal
        r = range(*slice(st, sp, step).indices(n))
        if len(r) == 0:
            return zeros_like(b, x)
        if step < 0:
            out = reverse_axes(b, out, [ax])
            first, step = r[-1], -step
        else:
            first = r[0]
        out = dilate(b, out, ax, step)
        out = take_window(b, out, ax, -first, n)
    return out


def _slice_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    return [None if g is None or not ins[0].dtype.is_float else _slice_transpose(b, g, ins[0], attrs)]


def _concat_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not outs[0].dtype.is_float:
        return [None] * len(ins)
    if len(ins) == 1:
        return [g]
    ax = normalize_axis(attrs["axis"], g.rank)  # type: ignore[arg-type]
    res: list[Any] = []
    off = 0
    for x in ins:
        n = x.shape[ax]
        res.append(b.op("slice", g, starts=(off,), stops=(off + n,), axes=(ax,)))
        off += n
    return res


def _concat_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import or_zeros

    if not outs[0].dtype.is_float or all(t is None for t in ts):
        return [None]
    return [b.op("concat", *[or_zeros(b, t, x) for t, x in zip(ts, ins)], axis=attrs["axis"])]


def _pad_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g, x = cts[0], ins[0]
    if g is None or not x.dtype.is_float:
        return [None]
    pads = attrs["pads"]
    r = x.rank
    axes = [i for i in range(r) if pads[i] or pads[i + r]]  # type: ignore[index]
    if not axes:
        return [g]
    return [b.op("slice", g, starts=tuple(pads[i] for i in axes),  # type: ignore[index]
                 stops=tuple(pads[i] + x.shape[i] for i in axes), axes=tuple(axes))]  # type: ignore[index]


# -- vmap rules (the batch is a new leading axis 0: axis attributes shift by one) ----------------

def _shift(axis: Any, rank: int) -> int:
    return normalize_axis(int(axis), rank) + 1


def _reshape_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    return [b.op("reshape", ins[0], shape=(ins[0].shape[0], *attrs["shape"]))], [True]  # type: ignore[misc]


def _transpose_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    perm = _perm(attrs, ins[0].rank - 1)
    return [b.op("transpose", ins[0], perm=(0, *(p + 1 for p in perm)))], [True]


def _expand_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    from ...autodiff._util import expand_to, reshape

    x = ins[0]
    target = tuple(attrs["shape"])  # type: ignore[arg-type]
    x = reshape(b, x, (x.shape[0],) + (1,) * (len(target) - (x.rank - 1)) + x.shape[1:])
    return [expand_to(b, x, (x.shape[0], *target))], [True]


def _slice_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    r = ins[0].rank - 1
    a: dict[str, Any] = dict(attrs)
    axes = a["axes"] if a["axes"] is not None else tuple(range(len(a["starts"])))
    a["axes"] = tuple(_shift(ax, r) for ax in axes)
    return [b.op("slice", ins[0], **a)], [True]


def _concat_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    r = ins[0].rank - 1 if flags[0] else ins[0].rank
    xs = [t if f else b.op("expand", t, shape=(size, *t.shape)) for t, f in zip(ins, flags)]
    return [b.op("concat", *xs, axis=_shift(attrs["axis"], r))], [True]


def _pad_batch(b: Any, ins: Sequence[Any], flags: Sequence[bool], attrs: Attrs, size: Dim) -> Any:
    r = ins[0].rank - 1
    p = tuple(attrs["pads"])  # type: ignore[arg-type]
    return [b.op("pad", ins[0], pads=(0, *p[:r], 0, *p[r:]), value=attrs["value"])], [True]


# -- declarations --------------------------------------------------------------------------------

def _any(value: Any) -> Any:
    """An attribute value, untyped (attribute values are checked by the schema)."""
    return value


def _no_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return 0.0


def _infer_reshape(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = list(attrs["shape"])  # type: ignore[arg-type]
    src = ts[0].shape
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape target {tuple(shape)} has more than one -1", fix="use at most one -1")
    if any(isinstance(d, str) for d in src) or any(isinstance(d, str) for d in shape):
        # Symbolic: the element counts are polynomials; they must be equal (a -1 is their exact quotient).
        n_sym = symexpr.numel(src)
        rest = symexpr.prod(d for d in shape if d != -1)
        if -1 in shape:
            q = symexpr.div_exact(n_sym, rest) if rest != 0 else None
            if q is None:
                raise ShapeError(f"reshape {src} -> {tuple(shape)}: the -1 would be ({n_sym}) / ({rest}), "
                                 f"which is not a polynomial in the symbols",
                                 fix="name the inferred dim in the target shape (e.g. 'batch*seq')")
            shape[shape.index(-1)] = q
        elif n_sym != rest:
            raise ShapeError(f"reshape {src} -> {tuple(shape)} changes the element count ({n_sym} vs {rest})",
                             fix="the product of the dims must stay the same")
        return [TensorType(ts[0].dtype, tuple(shape))]
    n = math.prod(src)
    if -1 in shape:
        rest = math.prod(d for d in shape if d != -1)
        if rest == 0 or n % rest:
            raise ShapeError(f"cannot reshape {src} ({n} elements) to {tuple(shape)}",
                             fix="the product of the dims must divide the element count")
        shape[shape.index(-1)] = n // rest
    if math.prod(shape) != n:
        raise ShapeError(f"cannot reshape {src} ({n} elements) to {tuple(shape)}",
                         fix="the product of the dims must equal the element count")
    return [TensorType(ts[0].dtype, tuple(shape))]


register_op(OpSchema("reshape", ("x",), _infer_reshape,
                     lambda xs, a: [xs[0].reshape([d for d in _concrete_shape(a["shape"], xs[0])])],
                     attrs=(AttrSpec("shape", "shape", doc="target shape; one -1 may be inferred"),),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("reshape"),
                     dtypes=STORAGE,
                     vjp=_reshape_vjp, jvp=_linear_jvp("reshape"), batch=_reshape_batch,
                     doc="same elements, new shape"))


def _concrete_shape(shape: Any, x: np.ndarray) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in shape]


def _infer_transpose(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    perm: Any = attrs["perm"]
    r = ts[0].rank
    if perm is None:
        perm = tuple(reversed(range(r)))
    if sorted(normalize_axis(p, r) for p in perm) != list(range(r)):
        raise ShapeError(f"transpose perm {perm} is not a permutation of {r} axes",
                         fix=f"list each axis 0..{r - 1} exactly once")
    return [TensorType(ts[0].dtype, tuple(ts[0].shape[normalize_axis(p, r)] for p in perm))]


register_op(OpSchema("transpose", ("x",), _infer_transpose,
                     lambda xs, a: [np.transpose(xs[0], _any(a["perm"]))],
                     attrs=(AttrSpec("perm", "ints", default=None, doc="axis order; None reverses"),),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("transpose"),
                     dtypes=STORAGE,
                     vjp=_transpose_vjp, jvp=_linear_jvp("transpose"), batch=_transpose_batch,
                     doc="permute axes"))


def _infer_expand(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    target = tuple(attrs["shape"])  # type: ignore[arg-type]
    src = ts[0].shape
    if len(target) < len(src):
        raise ShapeError(f"expand to {target} has lower rank than the input {src}",
                         fix="the target rank must be >= the input rank")
    out = broadcast_shapes(src, target)
    if out != target:
        raise ShapeError(f"cannot expand {src} to {target}", fix="only size-1 dims can be expanded")
    return [TensorType(ts[0].dtype, target)]


register_op(OpSchema("expand", ("x",), _infer_expand,
                     lambda xs, a: [np.broadcast_to(xs[0], tuple(a["shape"]))],  # type: ignore[arg-type]
                     attrs=(AttrSpec("shape", "shape", doc="target shape (NumPy broadcasting)"),),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("expand"),
                     vjp=_expand_vjp, jvp=_linear_jvp("expand"), batch=_expand_batch,
                     doc="broadcast to a larger shape"))

_BIG = 2**62


def slice_params(attrs: Attrs, shape: Sequence[Dim]) -> list[tuple[int, slice]]:
    """A ``slice`` node's attributes resolved against its input shape: one ``(axis, slice)`` per sliced
    axis, axes normalised, ``stops`` clamped so a Python/NumPy slice takes them as they are.

    Public (``rlx_core.plugin.slice_params``) so every backend slices exactly as the reference does;
    raises :class:`ShapeError` for mismatched lengths, a zero step or an axis listed twice."""
    starts: Any = attrs["starts"]
    stops: Any = attrs["stops"]
    axes: Any = attrs["axes"] if attrs["axes"] is not None else tuple(range(len(starts)))
    steps: Any = attrs["steps"] if attrs["steps"] is not None else (1,) * len(starts)
    if not (len(starts) == len(stops) == len(axes) == len(steps)):
        raise ShapeError("slice: starts, stops, axes and steps must have the same length",
                         fix="give one entry per sliced axis")
    out = []
    for st, sp, ax, step in zip(starts, stops, axes, steps):
        if step == 0:
            raise ShapeError("slice step is 0", fix="use a non-zero step")
        out.append((normalize_axis(ax, len(shape)), slice(st, min(sp, _BIG) if sp > 0 else sp, step)))
    if len({a for a, _ in out}) != len(out):
        raise ShapeError("slice lists an axis twice", fix="list each axis once")
    return out


def _infer_slice(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = list(ts[0].shape)
    for ax, sl in slice_params(attrs, shape):
        d = shape[ax]
        if isinstance(d, str):
            if sl.start == 0 and sl.stop >= _BIG and sl.step == 1:
                continue
            if sl.step == 1 and sl.start >= 0 and (sl.stop >= _BIG or sl.stop < 0):
                # x[s:] / x[s:-e] is d - s - e long once d >= s + e. Below that the symbolic type
                # is moot: specialisation re-infers this node from the bound size (an empty slice).
                shape[ax] = symexpr.sub(d, sl.start + (0 if sl.stop >= _BIG else -sl.stop))
                continue
            raise ShapeError(f"slice of symbolic dim {d!r} needs a concrete size",
                             fix="specialize the graph (bind the symbol) before slicing it")
        shape[ax] = len(range(*sl.indices(d)))
    return [TensorType(ts[0].dtype, tuple(shape))]


def _ref_slice(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    idx: list[Any] = [slice(None)] * xs[0].ndim
    for ax, sl in slice_params(attrs, xs[0].shape):
        idx[ax] = sl
    return [xs[0][tuple(idx)]]


register_op(OpSchema("slice", ("x",), _infer_slice, _ref_slice,
                     attrs=(AttrSpec("starts", "ints"), AttrSpec("stops", "ints"),
                            AttrSpec("axes", "ints", default=None),
                            AttrSpec("steps", "ints", default=None)),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("slice"),
                     dtypes=STORAGE,
                     vjp=_slice_vjp, jvp=_linear_jvp("slice"), batch=_slice_batch,
                     doc="Python slicing per axis (negative indices and steps, clamped)"))


def _infer_concat(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = _same_dtype("concat", ts)
    r = ts[0].rank
    ax = normalize_axis(attrs["axis"], r)  # type: ignore[arg-type]
    total: Dim = 0
    for i, t in enumerate(ts):
        if t.rank != r or any(t.shape[j] != ts[0].shape[j] for j in range(r) if j != ax):
            raise ShapeError(f"concat input {i} has shape {t.shape}, incompatible with {ts[0].shape}",
                             fix=f"all inputs must match except on axis {ax}")
        total = symexpr.add(total, t.shape[ax])
    shape = list(ts[0].shape)
    shape[ax] = total
    return [TensorType(dt, tuple(shape))]


register_op(OpSchema("concat", ("xs*",), _infer_concat,
                     lambda xs, a: [np.concatenate(list(xs), axis=a["axis"])],  # type: ignore[arg-type]
                     attrs=(AttrSpec("axis", "int"),),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("concat"),
                     dtypes=STORAGE,
                     vjp=_concat_vjp, jvp=_concat_jvp, batch=_concat_batch, doc="join along an axis"))


def _infer_pad(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    pads: Any = attrs["pads"]
    r = ts[0].rank
    if len(pads) != 2 * r or any(p < 0 for p in pads):
        raise ShapeError(f"pad needs {2 * r} non-negative pads (all befores, then all afters), "
                         f"got {pads}", fix="pads = (b0, b1, ..., e0, e1, ...)")
    shape = []
    for i, d in enumerate(ts[0].shape):
        shape.append(symexpr.add(d, pads[i] + pads[i + r]))
    return [TensorType(ts[0].dtype, tuple(shape))]


def _ref_pad(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    r = xs[0].ndim
    if r == 0:  # np.pad rejects an empty pad_width; a rank-0 tensor has nothing to pad
        return [xs[0].copy()]
    pads: Any = attrs["pads"]
    width = [(pads[i], pads[i + r]) for i in range(r)]
    return [np.pad(xs[0], width, constant_values=np.asarray(attrs["value"]).astype(xs[0].dtype))]


register_op(OpSchema("pad", ("x",), _infer_pad, _ref_pad,
                     attrs=(AttrSpec("pads", "ints", doc="befores then afters, one per axis"),
                            AttrSpec("value", "float", default=0.0)),
                     category="movement", flops=_no_flops, accuracy="exact", cases=CaseSpec("pad"),
                     vjp=_pad_vjp, jvp=_linear_jvp("pad", value=0.0), batch=_pad_batch,
                     doc="constant padding"))
