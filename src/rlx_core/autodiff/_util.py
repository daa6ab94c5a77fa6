"""Shared machinery: a builder that re-emits existing nodes, and small graph-building helpers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import ShapeError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph, Node, infer_node
from ..ir.schema import REGISTRY, OpSchema
from ..ir.types import Dim, TensorType, normalize_axis

#: ``stop`` of a slice that runs to the far end (as the MIR slice clamps it).
BIG = 2**62


class ADBuilder(GraphBuilder):
    """A :class:`GraphBuilder` that can re-emit an existing :class:`Node` under its own names and
    never hands out a reserved name (the names of the graph being transformed)."""

    def __init__(self, name: str, reserved: Iterable[str] = ()) -> None:
        super().__init__(name)
        self._reserved: set[str] = set(reserved)

    def fresh(self, base: str) -> str:
        while True:
            name = super().fresh(base)
            if name not in self._reserved:
                return name

    def reserve(self, names: Iterable[str]) -> None:
        self._reserved.update(names)

    def tensor(self, name: str) -> Tensor:
        return Tensor(self, name, self._types[name])

    def has(self, name: str) -> bool:
        return name in self._types

    @property
    def nodes(self) -> list[Node]:
        return self._nodes

    def add_node(self, node: Node) -> list[Tensor]:
        """Append ``node`` as is (its names are kept); returns its output tensors."""
        schema = REGISTRY.get(node.op, where=node.where)
        attrs = schema.check_attrs(node.attrs, node.where)
        node = Node(node.name, node.op, node.inputs, node.outputs, attrs)
        types = infer_node(schema, node, [self._types[i] for i in node.inputs])
        self._nodes.append(node)
        return [self._define(o, t) for o, t in zip(node.outputs, types)]

    def emit(self, op: str, ins: Sequence[Tensor], attrs: Any) -> list[Tensor]:
        """``op(*ins, **attrs)`` under fresh names, always as a list of outputs."""
        out = self.op(op, *ins, **dict(attrs))
        return list(out) if isinstance(out, tuple) else [out]


def unique_name(want: str, taken: Any) -> str:
    """``want``, or ``want_1``, ``want_2``... whichever is not in ``taken``."""
    if want not in taken:
        return want
    k = 1
    while f"{want}_{k}" in taken:
        k += 1
    return f"{want}_{k}"


def decomposition_graph(schema: OpSchema, in_types: Sequence[TensorType], attrs: Any) -> Graph:
    """The op's decomposition as a small graph with inputs ``in0, in1, ...`` (constants as params)."""
    sub = GraphBuilder(f"{schema.name}_decomposition")
    ins = [sub.input(f"in{i}", t.dtype, t.shape) for i, t in enumerate(in_types)]
    assert schema.decompose is not None, schema.name  # callers check that the op has one
    outs = schema.decompose(sub, ins, attrs)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o in outs:
        sub.output(o)
    return sub.build()


def is_float(t: TensorType | Tensor) -> bool:
    return t.dtype.is_float


def is_static(shape: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in shape)


# -- small builders ------------------------------------------------------------------------------

def const(b: GraphBuilder, value: Any, dtype: DType) -> Tensor:
    return b.const(value, dtype)


def full(b: GraphBuilder, value: float, shape: Sequence[Dim], dtype: DType) -> Tensor:
    c = b.const(value, dtype)
    return c if tuple(shape) == () else b.op("expand", c, shape=tuple(shape))


def zeros(b: GraphBuilder, shape: Sequence[Dim], dtype: DType) -> Tensor:
    return full(b, 0.0 if dtype.is_float else 0, shape, dtype)


def zeros_like(b: GraphBuilder, t: Tensor | TensorType) -> Tensor:
    return zeros(b, t.shape, t.dtype)


def or_zeros(b: GraphBuilder, t: Tensor | None, like: Tensor) -> Tensor:
    return t if t is not None else zeros_like(b, like)


def expand_to(b: GraphBuilder, t: Tensor, shape: Sequence[Dim]) -> Tensor:
    shape = tuple(shape)
    if t.shape == shape:
        return t
    return b.op("expand", t, shape=shape)


def reshape(b: GraphBuilder, t: Tensor, shape: Sequence[Dim]) -> Tensor:
    shape = tuple(shape)
    if t.shape == shape:
        return t
    return b.op("reshape", t, shape=shape)


def sum_to(b: GraphBuilder, g: Tensor, shape: Sequence[Dim]) -> Tensor:
    """Sum ``g`` down to ``shape`` (the transpose of NumPy broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.rank - len(shape)
    axes = list(range(lead))
    for i, d in enumerate(shape):
        if d == 1 and g.shape[lead + i] != 1:
            axes.append(lead + i)
    out = b.op("reduce_sum", g, axes=tuple(axes), keepdims=True) if axes else g
    return reshape(b, out, shape)


def swap_last(b: GraphBuilder, t: Tensor) -> Tensor:
    r = t.rank
    return b.op("transpose", t, perm=(*range(r - 2), r - 1, r - 2))


def keep_shape(shape: Sequence[Dim], axes: Sequence[int]) -> tuple[Dim, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def red_axes(attrs: Any, rank: int) -> tuple[int, ...]:
    axes = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted({normalize_axis(a, rank) for a in axes}))


def restore_reduced(b: GraphBuilder, g: Tensor, x: Tensor, axes: Sequence[int], keepdims: bool,
                    expand: bool = True) -> Tensor:
    """Bring a reduction's cotangent back to keepdims shape (and broadcast it to ``x``'s shape)."""
    if not keepdims:
        g = reshape(b, g, keep_shape(x.shape, axes))
    return expand_to(b, g, x.shape) if expand else g


def count(b: GraphBuilder, shape: Sequence[Dim], axes: Sequence[int], dtype: DType) -> Tensor:
    """The number of elements over ``axes`` of ``shape``: a constant, or computed when symbolic."""
    dims = [shape[a] for a in axes]
    if all(isinstance(d, int) for d in dims):
        return b.const(float(math.prod(dims)), dtype)
    ones = full(b, 1.0, tuple(shape[a] if a in axes else 1 for a in range(len(shape))), dtype)
    return b.op("reduce_sum", ones, axes=None, keepdims=False)


def reverse_axes(b: GraphBuilder, t: Tensor, axes: Sequence[int]) -> Tensor:
    axes = [a for a in axes if t.shape[a] != 1]
    if not axes:
        return t
    return b.op("slice", t, starts=(-1,) * len(axes), stops=(-BIG,) * len(axes), axes=tuple(axes),
                steps=(-1,) * len(axes))


def dilate(b: GraphBuilder, t: Tensor, axis: int, step: int) -> Tensor:
    """Insert ``step - 1`` zeros after every element along ``axis`` (length n -> n * step)."""
    if step == 1:
        return t
    n = t.shape[axis]
    if not isinstance(n, int):
        raise ShapeError(f"cannot interleave zeros along symbolic dim {n!r}", fix="specialize first")
    s = t.shape
    u = reshape(b, t, s[:axis + 1] + (1,) + s[axis + 1:])
    z = zeros(b, s[:axis + 1] + (step - 1,) + s[axis + 1:], t.dtype)
    c = b.op("concat", u, z, axis=axis + 1)
    return reshape(b, c, s[:axis] + (n * step,) + s[axis + 1:])


def window(t: Tensor, axis: int, start: int, length: int) -> tuple[int, int, int, int] | None:
    """Plan ``y[i] = t[start + i]`` for ``i < length`` (zero outside ``t``): ``(lo, hi, before,
    after)`` = slice ``[lo, hi)`` of ``t`` then zero-pad ``before``/``after``; ``None`` if empty."""
    n = t.shape[axis]
    assert isinstance(n, int)
    lo, hi = max(start, 0), min(start + length, n)
    if hi <= lo:
        return None
    return lo, hi, lo - start, start + length - hi


def take_window(b: GraphBuilder, t: Tensor, axis: int, start: int, length: int) -> Tensor:
    plan = window(t, axis, start, length)
    if plan is None:
        s = list(t.shape)
        s[axis] = length
        return zeros(b, s, t.dtype)
    lo, hi, before, after = plan
    n = t.shape[axis]
    if lo > 0 or hi < n:  # type: ignore[operator]
        t = b.op("slice", t, starts=(lo,), stops=(hi,), axes=(axis,))
    if before or after:
        pads = [0] * (2 * t.rank)
        pads[axis] = before
        pads[t.rank + axis] = after
        t = b.op("pad", t, pads=tuple(pads))
    return t


def as_array(x: Any, dtype: DType) -> np.ndarray:
    return np.asarray(x, dtype=dtype.np)
