"""Reverse (vjp) and forward (jvp) rules for the MIR ops that do not carry them on their schema.

Each rule builds MIR nodes only, so gradients run on any backend and can be differentiated again.
Conventions follow PyTorch where a choice exists (the op families in :mod:`rlx_core.ir.ops`
state theirs: ``maximum``/``minimum`` split the gradient equally on ties, ``reduce_max``/
``reduce_min`` share it among all maximal elements, ``pow`` has no exponent gradient where the base
is 0 and the exponent >= 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..dtypes import DType
from ..errors import ShapeError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.types import Attrs, broadcast_shapes, normalize_axis
from ._util import (
    BIG,
    dilate,
    expand_to,
    is_static,
    keep_shape,
    or_zeros,
    reshape,
    reverse_axes,
    sum_to,
    swap_last,
    window,
    zeros,
)
from .registry import register_jvp, register_vjp

Cts = Sequence["Tensor | None"]
Ts = Sequence[Tensor]
B = GraphBuilder


def _c(b: GraphBuilder, value: float, like: Tensor) -> Tensor:
    return b.const(value, like.dtype)


def _fl(t: Tensor) -> bool:
    return t.dtype.is_float


def zero_rules(op: str) -> None:
    """No gradient and no tangent (iota)."""
    register_vjp(op, lambda b, ins, outs, cts, attrs: [None] * len(ins))
    register_jvp(op, lambda b, ins, outs, ts, attrs: [None] * len(outs))


zero_rules("iota")


# The elementwise ops (unary, binary, compare, logical, where, cast), the reductions (reduce_*,
# argmax, argmin) and the movement ops (reshape, transpose, expand, slice, concat, pad) carry their
# rules on their schemas: see rlx_core.ir.ops.


# -- ops that are linear in their (single) differentiable input: jvp applies the op itself -------

def _jvp_same(op: str, **override: Any) -> None:
    def jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
        t = ts[0]
        if t is None or not _fl(outs[0]):
            return [None]
        return [b.op(op, t, **{**dict(attrs), **override})]

    register_jvp(op, jvp)


_jvp_same("cumsum")


# -- scans ---------------------------------------------------------------------------------------

@register_vjp("cumsum")
def _cumsum_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not _fl(ins[0]):
        return [None]
    return [b.op("cumsum", g, axis=attrs["axis"], exclusive=attrs["exclusive"], reverse=not attrs["reverse"])]


# -- matmul --------------------------------------------------------------------------------------

@register_vjp("matmul")
def _matmul_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    a, c = ins
    if g is None or not _fl(outs[0]):
        return [None, None]
    k = a.shape[-1]
    a2 = a if a.rank >= 2 else reshape(b, a, (1, k))
    c2 = c if c.rank >= 2 else reshape(b, c, (k, 1))
    out2 = broadcast_shapes(a2.shape[:-2], c2.shape[:-2]) + (a2.shape[-2], c2.shape[-1])
    g2 = reshape(b, g, out2)
    da = reshape(b, sum_to(b, b.op("matmul", g2, swap_last(b, c2)), a2.shape), a.shape)
    if c2.rank == 2 and a2.rank > 2 and is_static(a2.shape) and is_static(g2.shape):
        # (.., m, k)^T @ (.., m, n) summed over the batch is one GEMM over the flattened rows.
        af = reshape(b, a2, (-1, a2.shape[-1]))
        gf = reshape(b, g2, (-1, g2.shape[-1]))
        dc = b.op("matmul", swap_last(b, af), gf)
    else:
        dc = sum_to(b, b.op("matmul", swap_last(b, a2), g2), c2.shape)
    return [da, reshape(b, dc, c.shape)]


@register_jvp("matmul")
def _matmul_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    ta, tc = ts
    a, c = ins
    if not _fl(outs[0]) or (ta is None and tc is None):
        return [None]
    parts = ([b.op("matmul", ta, c)] if ta is not None else []) + \
            ([b.op("matmul", a, tc)] if tc is not None else [])
    return [parts[0] if len(parts) == 1 else parts[0] + parts[1]]


# -- gather / scatter_add ------------------------------------------------------------------------

def gather_transpose(b: GraphBuilder, g: Tensor, x: Tensor | Any, idx: Tensor, axis: int) -> Tensor:
    """The cotangent of ``gather(x, idx, axis)`` w.r.t. ``x``: repeated indices add up."""
    xs = tuple(x.shape)
    rank = len(xs)
    ax = normalize_axis(axis, rank)
    z = zeros(b, xs, g.dtype)
    if idx.rank == 0:
        g1 = reshape(b, g, xs[:ax] + (1,) + xs[ax + 1:])
        i1 = expand_to(b, reshape(b, idx, (1,) * rank), g1.shape)
        return b.op("scatter_add", z, i1, g1, axis=ax)
    if idx.rank > 1 and is_static(idx.shape):
        m = math.prod(idx.shape)  # type: ignore[arg-type]
        g = reshape(b, g, xs[:ax] + (m,) + xs[ax + 1:])
        idx = reshape(b, idx, (m,))
    view = (1,) * ax + idx.shape + (1,) * (rank - ax - 1)
    i1 = expand_to(b, reshape(b, idx, view), g.shape)
    if idx.rank == 1:
        return b.op("scatter_add", z, i1, g, axis=ax)
    # Symbolic index dims cannot be flattened: scatter into a buffer that keeps the leading index
    # axes (scatter_add needs indices of the data's rank), then sum those axes away.
    lead = idx.shape[:-1]
    buf = zeros(b, xs[:ax] + lead + (xs[ax],) + xs[ax + 1:], g.dtype)
    buf = b.op("scatter_add", buf, i1, g, axis=ax + idx.rank - 1)
    return b.op("reduce_sum", buf, axes=tuple(range(ax, ax + idx.rank - 1)), keepdims=False)


def take_along_axis(b: GraphBuilder, g: Tensor, idx: Tensor, axis: int) -> Tensor:
    """``out[i] = g[i with i[axis] replaced by idx[i]]`` (the transpose of scatter_add)."""
    r = g.rank
    ax = normalize_axis(axis, r)
    s, ishape = g.shape, idx.shape
    n = s[ax]
    if not isinstance(n, int):
        raise ShapeError(f"the gradient of scatter_add along symbolic dim {n!r} is not supported",
                         fix="specialize the graph (bind the symbol) before differentiating")
    pos = idx if idx.dtype is DType.I64 else b.op("cast", idx, to=DType.I64)
    zero = b.const(0, DType.I64)
    pos = b.op("where", b.op("less", pos, zero), pos + b.const(n, DType.I64), pos)
    if is_static(s) and is_static(ishape):
        strides = [math.prod(s[j + 1:]) for j in range(r)]  # type: ignore[arg-type]
        lin = pos * b.const(strides[ax], DType.I64) if strides[ax] != 1 else pos
        for j in range(r):
            if j != ax and ishape[j] != 1:
                io = b.op("iota", shape=ishape, axis=j, dtype=DType.I64)
                lin = lin + (io * b.const(strides[j], DType.I64) if strides[j] != 1 else io)
        flat = reshape(b, g, (math.prod(s),))  # type: ignore[arg-type]
        return b.op("gather", flat, lin, axis=0)
    # Symbolic: a one-hot mask along a new axis next to `axis`, multiplied and summed.
    for j in range(r):
        if j != ax and ishape[j] != s[j]:
            if not isinstance(ishape[j], int):
                raise ShapeError("scatter_add indices smaller than the data on a symbolic axis",
                                 fix="specialize the graph before differentiating")
            g = b.op("slice", g, starts=(0,), stops=(ishape[j],), axes=(j,))
    pe = reshape(b, pos, ishape[:ax + 1] + (1,) + ishape[ax + 1:])
    io = b.op("iota", shape=(1,) * (ax + 1) + (n,) + (1,) * (r - ax - 1), axis=ax + 1, dtype=DType.I64)
    mask = b.op("cast", b.op("equal", pe, io), to=g.dtype)
    ge = reshape(b, g, g.shape[:ax] + (1,) + g.shape[ax:])
    return b.op("reduce_sum", mask * ge, axes=(ax + 1,), keepdims=False)


@register_vjp("gather")
def _gather_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not _fl(ins[0]):
        return [None, None]
    return [gather_transpose(b, g, ins[0], ins[1], attrs["axis"]), None]  # type: ignore[arg-type]


@register_jvp("gather")
def _gather_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    t = ts[0]
    if t is None or not _fl(outs[0]):
        return [None]
    return [b.op("gather", t, ins[1], axis=attrs["axis"])]


@register_vjp("scatter_add")
def _scatter_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not _fl(outs[0]):
        return [None, None, None]
    return [g, None, take_along_axis(b, g, ins[1], attrs["axis"])]  # type: ignore[arg-type]


@register_jvp("scatter_add")
def _scatter_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    tx, _, tu = ts
    if not _fl(outs[0]) or (tx is None and tu is None):
        return [None]
    if tu is None:
        return [tx]
    return [b.op("scatter_add", or_zeros(b, tx, ins[0]), ins[1], tu, axis=attrs["axis"])]


# -- conv2d --------------------------------------------------------------------------------------

def conv_attrs(attrs: Any) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], int]:
    return (tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]),  # type: ignore[return-value]
            int(attrs["groups"]))


def conv_input_grad(b: GraphBuilder, g: Tensor, w: Tensor, x_shape: Sequence[Any], attrs: Any) -> Tensor:
    """d conv2d / d x: a stride-1 convolution of the zero-interleaved cotangent with the flipped,
    in/out-swapped weights; padding and the rows the forward stride skipped become windows."""
    (sh, sw), (pt, pl, _, _), (dh, dw), groups = conv_attrs(attrs)
    _, _, h, wd = x_shape
    o, cg, kh, kw = w.shape
    gd = g
    pads = []
    for axis, n, k, s, d, p0 in ((2, h, kh, sh, dh, pt), (3, wd, kw, sw, dw, pl)):
        gd = dilate(b, gd, axis, s)
        length = n + d * (k - 1)
        plan = window(gd, axis, p0 - d * (k - 1), length)
        if plan is None:
            return zeros(b, x_shape, g.dtype)
        lo, hi, before, after = plan
        if lo > 0 or hi < gd.shape[axis]:
            gd = b.op("slice", gd, starts=(lo,), stops=(hi,), axes=(axis,))
        pads.append((before, after))
    og = o // groups
    if groups == 1:
        wt = b.op("transpose", w, perm=(1, 0, 2, 3))
    else:
        wt = reshape(b, w, (groups, og, cg, kh, kw))
        wt = reshape(b, b.op("transpose", wt, perm=(0, 2, 1, 3, 4)), (groups * cg, og, kh, kw))
    wt = reverse_axes(b, wt, [2, 3])
    return b.op("conv2d", gd, wt, strides=(1, 1), pads=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]),
                dilations=(dh, dw), groups=groups)


def conv_weight_grad(b: GraphBuilder, x: Tensor, g: Tensor, w_shape: Sequence[Any], attrs: Any) -> Tensor:
    """d conv2d / d w: the batch becomes the contracted channel axis, the forward stride becomes
    the dilation and the forward dilation the stride."""
    (sh, sw), pads, (dh, dw), groups = conv_attrs(attrs)
    o, cg, kh, kw = w_shape
    n, c, h, wd = x.shape
    og = o // groups

    def one(xs: Tensor, gs: Tensor, grp: int) -> Tensor:
        r = b.op("conv2d", xs, b.op("transpose", gs, perm=(1, 0, 2, 3)), strides=(dh, dw), pads=pads,
                 dilations=(sh, sw), groups=grp)
        return b.op("transpose", r, perm=(1, 0, 2, 3))

    if groups == 1:
        res = one(b.op("transpose", x, perm=(1, 0, 2, 3)), g, 1)
    elif isinstance(n, int):
        xt = reshape(b, x, (n, groups, cg, h, wd))
        xt = reshape(b, b.op("transpose", xt, perm=(2, 1, 0, 3, 4)), (cg, groups * n, h, wd))
        res = one(xt, g, groups)
    else:  # a symbolic batch cannot be folded into channels: one convolution per group
        parts = []
        for gi in range(groups):
            xs = b.op("slice", x, starts=(gi * cg,), stops=((gi + 1) * cg,), axes=(1,))
            gs = b.op("slice", g, starts=(gi * og,), stops=((gi + 1) * og,), axes=(1,))
            parts.append(one(b.op("transpose", xs, perm=(1, 0, 2, 3)), gs, 1))
        res = b.op("concat", *parts, axis=0)
    if res.shape[2] != kh or res.shape[3] != kw:
        res = b.op("slice", res, starts=(0, 0), stops=(kh, kw), axes=(2, 3))
    return res


@register_vjp("conv2d")
def _conv_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    x, w = ins
    if g is None or not _fl(outs[0]):
        return [None, None]
    return [conv_input_grad(b, g, w, x.shape, attrs), conv_weight_grad(b, x, g, w.shape, attrs)]


@register_jvp("conv2d")
def _conv_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    tx, tw = ts
    x, w = ins
    if not _fl(outs[0]) or (tx is None and tw is None):
        return [None]
    parts = ([b.op("conv2d", tx, w, **dict(attrs))] if tx is not None else []) + \
            ([b.op("conv2d", x, tw, **dict(attrs))] if tw is not None else [])
    return [parts[0] if len(parts) == 1 else parts[0] + parts[1]]


__all__ = ["BIG", "conv_attrs", "conv_input_grad", "conv_weight_grad", "gather_transpose", "keep_shape",
           "take_along_axis", "zero_rules"]
