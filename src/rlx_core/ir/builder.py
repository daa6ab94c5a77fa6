"""A builder that reads like the math: ``h = g.relu(x @ w + b)``.

Every op call infers its result type immediately, so a shape or dtype error is raised at the line
that built the bad node, not later at compile time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IRError
from .graph import Graph, Node, Value, infer_node
from .schema import REGISTRY
from .types import Attrs, Dim, TensorType


class Tensor:
    """A handle to a value being built. Supports ``+ - * / @ **``, unary ``-`` and comparisons."""

    __slots__ = ("builder", "name", "type")

    def __init__(self, builder: GraphBuilder, name: str, type: TensorType) -> None:
        self.builder = builder
        self.name = name
        self.type = type

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def __repr__(self) -> str:
        return f"Tensor({self.name}: {self.type})"

    def _bin(self, op: str, other: Any, reverse: bool = False) -> Tensor:
        b = self.builder
        o = b.lift(other, like=self)
        return b.op(op, o, self) if reverse else b.op(op, self, o)

    def __add__(self, o: Any) -> Tensor: return self._bin("add", o)
    def __radd__(self, o: Any) -> Tensor: return self._bin("add", o, True)
    def __sub__(self, o: Any) -> Tensor: return self._bin("sub", o)
    def __rsub__(self, o: Any) -> Tensor: return self._bin("sub", o, True)
    def __mul__(self, o: Any) -> Tensor: return self._bin("mul", o)
    def __rmul__(self, o: Any) -> Tensor: return self._bin("mul", o, True)
    def __truediv__(self, o: Any) -> Tensor: return self._bin("div", o)
    def __rtruediv__(self, o: Any) -> Tensor: return self._bin("div", o, True)
    def __matmul__(self, o: Any) -> Tensor: return self._bin("matmul", o)
    def __rmatmul__(self, o: Any) -> Tensor: return self._bin("matmul", o, True)
    def __pow__(self, o: Any) -> Tensor: return self._bin("pow", o)
    def __neg__(self) -> Tensor: return self.builder.op("neg", self)
    def __lt__(self, o: Any) -> Tensor: return self._bin("less", o)
    def __le__(self, o: Any) -> Tensor: return self._bin("less_equal", o)
    def __gt__(self, o: Any) -> Tensor: return self._bin("greater", o)
    def __ge__(self, o: Any) -> Tensor: return self._bin("greater_equal", o)
    __hash__ = object.__hash__

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self.builder.op("reshape", self, shape=tuple(shape))

    def transpose(self, *perm: int) -> Tensor:
        return self.builder.op("transpose", self, perm=tuple(perm) if perm else None)

    @property
    def T(self) -> Tensor:  # noqa: N802 - the math name
        r = self.rank
        return self.transpose(*range(r - 2), r - 1, r - 2) if r >= 2 else self

    def astype(self, dtype: DType | str) -> Tensor:
        return self.builder.op("cast", self, to=DType.parse(dtype))

    def sum(self, axes: Any = None, keepdims: bool = False) -> Tensor:
        return self.builder.op("reduce_sum", self, axes=_axes(axes), keepdims=keepdims)

    def mean(self, axes: Any = None, keepdims: bool = False) -> Tensor:
        return self.builder.op("reduce_mean", self, axes=_axes(axes), keepdims=keepdims)

    def max(self, axes: Any = None, keepdims: bool = False) -> Tensor:
        return self.builder.op("reduce_max", self, axes=_axes(axes), keepdims=keepdims)


def _axes(axes: Any) -> Any:
    if axes is None:
        return None
    return (axes,) if isinstance(axes, int) else tuple(axes)


class GraphBuilder:
    """Build a :class:`Graph`. Op methods come from the op registry: ``g.exp(x)``, ``g.layer_norm(...)``.

    Example::

        g = GraphBuilder("mlp")
        x = g.input("x", "f32", ("batch", 4))
        w = g.param("w", np.ones((4, 2), np.float32))
        g.output(g.relu(x @ w), "y")
        graph = g.build()
    """

    def __init__(self, name: str = "graph", *, prefix: str = "") -> None:
        self.name = name
        self.prefix = prefix
        self._inputs: list[Value] = []
        self._params: list[Value] = []
        self._weights: dict[str, np.ndarray] = {}
        self._nodes: list[Node] = []
        self._outputs: list[str] = []
        self._types: dict[str, TensorType] = {}
        self._counter: dict[str, int] = {}
        self._const_cache: dict[tuple[Any, ...], Tensor] = {}

    # -- naming --------------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        while True:
            k = self._counter.get(base, 0)
            self._counter[base] = k + 1
            name = f"{self.prefix}{base}_{k}"
            if name not in self._types:
                return name

    def _define(self, name: str, t: TensorType) -> Tensor:
        if name in self._types:
            raise IRError(f"value {name!r} is defined twice", where=f"graph {self.name!r}",
                          fix="choose a unique name")
        self._types[name] = t
        return Tensor(self, name, t)

    # -- leaves --------------------------------------------------------------------------------
    def input(self, name: str, dtype: DType | str, shape: Sequence[Dim]) -> Tensor:
        t = TensorType(DType.parse(dtype), tuple(shape))
        self._inputs.append(Value(name, t))
        return self._define(name, t)

    def param(self, name: str, data: Any, dtype: DType | str | None = None) -> Tensor:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=DType.parse(dtype).np)
        if arr.dtype == np.float64 and dtype is None and not isinstance(data, np.ndarray):
            arr = arr.astype(np.float32)
        t = TensorType(DType.parse(arr.dtype), arr.shape)
        self._params.append(Value(name, t))
        self._weights[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")
        return self._define(name, t)

    def const(self, value: Any, dtype: DType | str) -> Tensor:
        """A constant tensor (stored as a parameter; equal scalars are shared)."""
        dt = DType.parse(dtype)
        arr = np.asarray(value, dtype=dt.np)
        key = (dt, arr.shape, arr.tobytes()) if arr.size <= 16 else None
        if key is not None and key in self._const_cache:
            return self._const_cache[key]
        t = self.param(self.fresh("const"), arr, dt)
        if key is not None:
            self._const_cache[key] = t
        return t

    def lift(self, value: Any, like: Tensor) -> Tensor:
        """Turn a Python/NumPy scalar or array into a constant of ``like``'s dtype."""
        if isinstance(value, Tensor):
            if value.builder is not self:
                raise IRError(f"tensor {value.name!r} belongs to another builder",
                              fix="build the whole graph with one GraphBuilder")
            return value
        return self.const(value, like.dtype)

    # -- ops -----------------------------------------------------------------------------------
    def op(self, op: str, *inputs: Tensor, name: str | None = None, **attrs: Any) -> Any:
        """Append one node; returns a Tensor (or a tuple for multi-output ops)."""
        schema = REGISTRY.get(op, where=f"graph {self.name!r}")
        nname = name or self.fresh(op)
        ins = []
        for x in inputs:
            if not isinstance(x, Tensor):
                raise IRError(f"op {op!r} got a {type(x).__name__} where a Tensor was expected",
                              where=f"node {nname!r}", fix="wrap constants with g.const(value, dtype)")
            ins.append(x)
        n_out = schema.num_outputs
        outs = (nname,) if n_out == 1 else tuple(f"{nname}:{i}" for i in range(n_out))
        attrs = {k: v for k, v in attrs.items()}
        node = Node(nname, op, tuple(x.name for x in ins), outs, Attrs({}))
        node = Node(nname, op, node.inputs, outs, schema.check_attrs(attrs, node.where))
        types = infer_node(schema, node, [x.type for x in ins])
        self._nodes.append(node)
        handles = tuple(self._define(o, t) for o, t in zip(outs, types))
        return handles[0] if n_out == 1 else handles

    def __getattr__(self, op: str) -> Any:
        if op.startswith("_") or op not in REGISTRY:
            raise AttributeError(f"GraphBuilder has no method or op {op!r}")

        def call(*inputs: Tensor, **attrs: Any) -> Any:
            return self.op(op, *inputs, **attrs)

        call.__name__ = op
        call.__doc__ = REGISTRY.get(op).doc
        return call

    # -- conveniences that read like the math ----------------------------------------------------
    def relu(self, x: Tensor) -> Tensor:
        return self.op("maximum", x, self.const(0, x.dtype))

    def output(self, x: Tensor, name: str | None = None) -> Tensor:
        """Mark ``x`` as a graph output, named ``name`` if given.

        Naming renames the value where it is computed, so it adds no node: a backend runs exactly
        the graph the user wrote (a test backend claiming only ``add`` runs ``g.output(x + x, "y")``).
        Only a value that cannot change its name gets a copy (an identity ``reshape``): a graph
        input or parameter (its name is the caller's interface), or a value already output under
        another name.
        """
        if name is not None and name != x.name:
            if self._renamable(x):
                self._rename(x, name)
            else:
                x = self.op("reshape", x, shape=x.shape, name=name)
        self._outputs.append(x.name)
        return x

    def _renamable(self, x: Tensor) -> bool:
        if x.builder is not self:
            raise IRError(f"tensor {x.name!r} belongs to another builder",
                          fix="build the whole graph with one GraphBuilder")
        leaves = {v.name for v in self._inputs} | {v.name for v in self._params}
        return x.name not in leaves and x.name not in self._outputs

    def _rename(self, x: Tensor, name: str) -> None:
        old = x.name
        if name in self._types or any(n.name == name for n in self._nodes):
            raise IRError(f"output name {name!r} is already used in graph {self.name!r}",
                          where=f"g.output({old}, {name!r})", fix="choose a unique output name")
        nodes = []
        for n in self._nodes:
            if old in n.outputs:
                outs = tuple(name if o == old else o for o in n.outputs)
                # The node keeps its name: errors and reports name the node the user wrote.
                n = Node(n.name, n.op, n.inputs, outs, n.attrs)
            elif old in n.inputs:
                n = Node(n.name, n.op, tuple(name if i == old else i for i in n.inputs), n.outputs, n.attrs)
            nodes.append(n)
        self._nodes = nodes
        self._types[name] = self._types.pop(old)
        x.name = name  # the one handle of this value (op() makes one Tensor per value)

    def build(self) -> Graph:
        return Graph(self.name, tuple(self._inputs), tuple(self._params), tuple(self._nodes),
                     tuple(self._outputs), dict(self._weights))
