"""MIR/HIR graphs: frozen, validated at construction, with types inferred for every value."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from types import MappingProxyType
from typing import Any

from ..dtypes import DType
from ..errors import IRError, RLXError, ShapeError
from . import symexpr
from .schema import REGISTRY, OpSchema
from .types import Attrs, TensorType

#: id(array) -> (weak reference, digest); arrays are unhashable, so no WeakKeyDictionary.
_DIGESTS: dict[int, tuple[Any, bytes]] = {}


def _frozen(w: Any) -> bool:
    """True when no view of ``w`` can be written (so its digest can be remembered)."""
    while w is not None:
        if getattr(w, "flags", None) is None or w.flags.writeable:
            return False
        w = getattr(w, "base", None)
        if w is not None and not hasattr(w, "flags"):  # mmap / bytes at the bottom of the chain
            return True
    return True


def _forget_digest(key: int, _ref: object) -> None:
    """The weakref callback: the array is gone, so its id may be reused by another."""
    _DIGESTS.pop(key, None)


def weight_digest(w: Any) -> bytes:
    """sha256 of a weight's bytes; remembered per array when nothing can write to it (memory-mapped
    model files), so specialising a 90 MB model per input shape does not rehash it each time."""
    import numpy as np

    entry = _DIGESTS.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    d = hashlib.sha256(np.ascontiguousarray(w).reshape(-1).view(np.uint8).data).digest()
    from ..pages import release_file_pages

    release_file_pages(w)  # read once for the key: a memory-mapped weight's pages leave the RSS
    if _frozen(w):
        try:
            key = id(w)
            _DIGESTS[key] = (weakref.ref(w, partial(_forget_digest, key)), d)
        except TypeError:
            pass
    return d


@dataclass(frozen=True)
class Value:
    """A named graph input or parameter with its type."""

    name: str
    type: TensorType

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise IRError(f"value name {self.name!r} must be a non-empty string")


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs = field(default_factory=Attrs)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise IRError(f"node name {self.name!r} must be a non-empty string")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))

    @property
    def where(self) -> str:
        return f"node {self.name!r} (op {self.op})"


def infer_node(schema: OpSchema, node: Node, in_types: Sequence[TensorType]) -> tuple[TensorType, ...]:
    """Check arity and attributes, then run the op's inference; errors name the node."""
    where = node.where
    schema.check_arity(len(in_types), where)
    try:
        outs = tuple(schema.infer(tuple(in_types), node.attrs))
    except RLXError as e:
        if e.where:
            raise
        raise type(e)(e.what, where=where, fix=e.fix) from None
    except Exception as e:  # a bug in a plugin's inference function must still name the node
        raise IRError(f"shape inference of op {schema.name!r} (from {schema.provider}) raised "
                      f"{type(e).__name__}: {e}", where=where,
                      fix="check the input types against the op's schema") from e
    if len(outs) != len(node.outputs):
        raise IRError(f"op {schema.name!r} produces {len(outs)} outputs but the node names "
                      f"{len(node.outputs)}", where=where, fix="name one output per op result")
    return outs


@dataclass(frozen=True)
class Graph:
    """A program over named values: inputs, parameters (with weights) and nodes in topological order.

    Construction validates everything and infers the type of every value; a bad graph cannot exist.
    """

    name: str
    inputs: tuple[Value, ...]
    params: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    weights: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    types: Mapping[str, TensorType] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        import numpy as np

        for attr in ("inputs", "params", "nodes", "outputs"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        types: dict[str, TensorType] = {}

        def define(name: str, t: TensorType, where: str) -> None:
            if name in types:
                raise IRError(f"value {name!r} is defined twice", where=where,
                              fix="every value name must be unique (SSA)")
            types[name] = t

        for v in self.inputs:
            define(v.name, v.type, f"graph input {v.name!r}")
        # An input's expression dim is checked against the fed size, never solved for: each of its
        # symbols must be fixed by a plain-symbol dim of some input.
        plain = {d for v in self.inputs for d in v.type.shape if isinstance(d, str) and d.isidentifier()}
        for v in self.inputs:
            for axis, d in enumerate(v.type.shape):
                free = sorted(symexpr.symbols(d) - plain) if symexpr.is_expr(d) else []
                if free:
                    raise IRError(f"graph input {v.name!r} axis {axis} is {d!r}, but no input has an "
                                  f"axis that is just {', '.join(map(repr, free))}",
                                  where=f"graph input {v.name!r}",
                                  fix="give some input a plain-symbol axis for each symbol of the "
                                      "expression, or make that axis a new symbol")
        weights: dict[str, Any] = {}
        for p in self.params:
            define(p.name, p.type, f"parameter {p.name!r}")
            if p.name not in self.weights:
                raise IRError(f"parameter {p.name!r} has no weight data", where=f"parameter {p.name!r}",
                              fix="pass its array in Graph(weights={...})")
            w = np.asarray(self.weights[p.name])
            if w.dtype != p.type.dtype.np or w.shape != p.type.shape:
                raise IRError(f"weight of {p.name!r} is {w.dtype}{list(w.shape)} but the parameter "
                              f"is declared {p.type}", where=f"parameter {p.name!r}",
                              fix="declare the parameter with the array's dtype and shape")
            if w.flags.writeable:
                w = w.view()
                w.flags.writeable = False
            weights[p.name] = w
        extra = set(self.weights) - {p.name for p in self.params}
        if extra:
            raise IRError(f"weights given for unknown parameters {sorted(extra)}",
                          fix="declare each weight as a parameter")
        object.__setattr__(self, "weights", MappingProxyType(weights))
        node_names: set[str] = set()
        checked_nodes: list[Node] = []
        for node in self.nodes:
            if node.name in node_names:
                raise IRError(f"node name {node.name!r} is used twice", where=node.where,
                              fix="node names must be unique")
            node_names.add(node.name)
            schema = REGISTRY.get(node.op, where=node.where)
            for i, name in enumerate(node.inputs):
                if name not in types:
                    raise IRError(f"input {i} {name!r} is not defined before this node", where=node.where,
                                  fix="nodes must be in topological order and name existing values")
            checked = schema.check_attrs(node.attrs, node.where)
            if checked != node.attrs:
                node = Node(node.name, node.op, node.inputs, node.outputs, checked)
            checked_nodes.append(node)
            outs = infer_node(schema, node, [types[n] for n in node.inputs])
            for name, t in zip(node.outputs, outs):
                define(name, t, node.where)
        object.__setattr__(self, "nodes", tuple(checked_nodes))
        for o in self.outputs:
            if o not in types:
                raise IRError(f"graph output {o!r} is not a defined value", where=f"graph {self.name!r}",
                              fix="name an input, parameter or node output")
        if not self.outputs:
            raise IRError("graph has no outputs", where=f"graph {self.name!r}",
                          fix="mark at least one value with builder.output(...)")
        object.__setattr__(self, "types", MappingProxyType(types))

    # -- queries -------------------------------------------------------------------------------
    @cached_property
    def producers(self) -> Mapping[str, Node]:
        return MappingProxyType({o: n for n in self.nodes for o in n.outputs})

    @cached_property
    def consumers(self) -> Mapping[str, tuple[Node, ...]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return MappingProxyType({k: tuple(v) for k, v in out.items()})

    def sole_reader(self, value: str) -> Node | None:
        """The node reading ``value`` when it is its only read (one node, one operand) and ``value``
        is not a graph output: what a fusion may fold into that reader."""
        users = self.consumers.get(value, ())
        return users[0] if len(users) == 1 and value not in self.outputs else None

    @cached_property
    def symbols(self) -> frozenset[str]:
        syms: set[str] = set()
        for v in self.inputs:
            syms |= v.type.symbols
        return frozenset(syms)

    @property
    def is_static(self) -> bool:
        return all(t.is_static for t in self.types.values())

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    # -- transformations -----------------------------------------------------------------------
    def specialize(self, bindings: Mapping[str, int]) -> Graph:
        """Bind symbolic dims (``{"batch": 8}``) and re-infer: the result is static where bound."""
        def sub(node: Node, schema: OpSchema) -> Attrs:
            attrs = node.attrs
            changes = {}
            for spec in schema.attrs:
                value = attrs.get(spec.name)
                if spec.kind == "shape" and isinstance(value, tuple):
                    changes[spec.name] = tuple(size(d, node.where) for d in value)
            return attrs.replace(**changes) if changes else attrs

        def size(d: Any, where: str) -> Any:
            v = symexpr.substitute(d, bindings)
            if symexpr.is_expr(d) and isinstance(v, int) and v < 0:
                # (a -1 here would silently mean "infer this dim" to reshape)
                used = ", ".join(f"{s}={bindings[s]}" for s in sorted(symexpr.symbols(d)))
                raise ShapeError(f"dimension {d} is {v} with {used}", where=where,
                                 fix=f"bind sizes that keep {d} >= 0")
            return v

        nodes = tuple(Node(n.name, n.op, n.inputs, n.outputs, sub(n, REGISTRY.get(n.op)))
                      for n in self.nodes)
        inputs = tuple(Value(v.name, v.type.specialize(bindings)) for v in self.inputs)
        return Graph(self.name, inputs, self.params, nodes, self.outputs, dict(self.weights))

    # -- identity ------------------------------------------------------------------------------
    def structure(self) -> dict[str, Any]:
        """The graph without weight data, as plain JSON-able data (used by hashing and files)."""
        def attr_json(v: Any) -> Any:
            if isinstance(v, DType):
                return {"dtype": v.value}
            if isinstance(v, tuple):
                return [attr_json(x) for x in v]
            if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
                return {"float": repr(v)}
            return v

        return {
            "name": self.name,
            "inputs": [{"name": v.name, "dtype": v.type.dtype.value, "shape": list(v.type.shape)}
                       for v in self.inputs],
            "params": [{"name": p.name, "dtype": p.type.dtype.value, "shape": list(p.type.shape)}
                       for p in self.params],
            "nodes": [{"name": n.name, "op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
                       "attrs": {k: attr_json(v) for k, v in n.attrs.items()}} for n in self.nodes],
            "outputs": list(self.outputs),
        }

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of structure and weight bytes: the compile-cache key."""

        h = hashlib.sha256(json.dumps(self.structure(), sort_keys=True).encode())
        for p in self.params:
            h.update(p.name.encode())
            h.update(weight_digest(self.weights[p.name]))
        return h.hexdigest()

    def __str__(self) -> str:
        lines = [f"graph {self.name}("
                 + ", ".join(f"{v.name}: {v.type}" for v in self.inputs) + ")"]
        for p in self.params:
            lines.append(f"  param {p.name}: {p.type}")
        for n in self.nodes:
            attrs = ", ".join(f"{k}={v}" for k, v in n.attrs.items())
            outs = ", ".join(f"{o}: {self.types[o]}" for o in n.outputs)
            lines.append(f"  {outs} = {n.op}({', '.join(n.inputs)}{'; ' + attrs if attrs else ''})")
        lines.append("  return " + ", ".join(self.outputs))
        return "\n".join(lines)
