"""The graph JSON of an ``.rlx`` file (:meth:`Graph.structure`): writing it, and the strict decoder.

The IR's own half of the file format, below the plugin hub: decoding needs every op the JSON names
to be registered already. :mod:`rlx_core.ir.serialize` (the file API, above the hub) first makes
missing ops known (core op modules, then the installed plugins), then decodes here; the compile
cache, whose entries hold graphs made in this process, decodes here directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IRError, RLXError, SerializationError, ShapeError
from ..formats.safetensors import _ST_CODES
from ..formats.shapes import shape_problem
from .graph import Graph, Node, Value
from .schema import REGISTRY
from .symexpr import canonical
from .types import TensorType

_GRAPH_KEYS = ("name", "inputs", "params", "nodes", "outputs")
_VALUE_KEYS = ("name", "dtype", "shape")
_NODE_KEYS = ("name", "op", "inputs", "outputs", "attrs")
_DTYPE_NAMES = {d.value: d for d in DType}
_NONFINITE = ("inf", "-inf", "nan")
_RESAVE = "the file is damaged or was edited by hand; save the graph again with rlx_core.save"
_UPGRADE = "upgrade rlx-core (pip install -U rlx-core) to read files written by newer versions"


def dumps_structure(graph: Graph) -> str:
    """The graph's structure as compact, key-sorted JSON (the exact text stored in a ``.rlx`` file)."""
    try:
        # allow_nan=False: structure() encodes non-finite floats itself, and bare NaN is not JSON.
        return json.dumps(graph.structure(), sort_keys=True, separators=(",", ":"), allow_nan=False,
                          ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise SerializationError(f"the structure of graph {graph.name!r} is not JSON-encodable: {e}",
                                 where=f"graph {graph.name!r}",
                                 fix="attributes must be ints, floats, bools, strings, dtypes, None or "
                                     "tuples of these") from None


def decode_structure(structure: Mapping[str, Any], weights: Mapping[str, Any], *,
                         source: str | None = None) -> Graph:
    """Rebuild a Graph from :meth:`Graph.structure` data and its weights, validating every field.
    Every op it names must be registered already (:func:`rlx_core.ir.serialize.graph_from_structure`
    first looks for missing ones in the core's op modules and the installed plugins).

    ``source`` (a file name) is only used in error messages.
    """
    decoder = _Decoder(source)
    try:
        return decoder.graph(structure, weights)
    except SerializationError:
        raise
    except RLXError as e:  # e.g. from Value/TensorType; the checks above should have caught it first
        raise SerializationError(e.what, where=f"{decoder.where}; {e.where}" if e.where else decoder.where,
                                 fix=e.fix or _RESAVE) from None
    except RecursionError:
        raise SerializationError("an attribute is nested too deeply", where=decoder.where,
                                 fix=_RESAVE) from None


def _jtype(v: Any) -> str:
    """The JSON name of a decoded value's type, for messages a user can match against the file."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, Mapping):
        return "object"
    return type(v).__name__


def _shape_problem(shape: Any, dtype: DType) -> str | None:
    """NumPy's shape limits (:func:`~rlx_core.formats.shapes.shape_problem`); a symbol counts as 1."""
    return shape_problem([d if _is_int(d) else 1 for d in shape], dtype.itemsize)


def _is_dim_str(d: str) -> bool:
    """A symbol name or a dimension expression (``"batch*seq"``, see :mod:`rlx_core.ir.symexpr`)."""
    try:
        canonical(d)
    except ShapeError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Decoder:
    """Walks the graph JSON; every error message starts with the location (``node 3 'add_0': ...``)."""

    def __init__(self, source: str | None) -> None:
        self.where = f"file {source}, metadata 'graph'" if source else "graph structure"

    def fail(self, loc: str, what: str, fix: str = _RESAVE) -> SerializationError:
        return SerializationError(f"{loc}: {what}", where=self.where, fix=fix)

    def fields(self, obj: Any, keys: tuple[str, ...], loc: str) -> Mapping[str, Any]:
        if not isinstance(obj, Mapping):
            raise self.fail(loc, f"must be a JSON object, got {_jtype(obj)}")
        for k in keys:
            if k not in obj:
                raise self.fail(loc, f"field {k!r} is missing", fix=f"{loc} needs the fields {list(keys)}")
        extra = sorted(str(k) for k in obj if k not in keys)
        if extra:
            # Version 1 has exactly these fields; anything else means a newer writer or a hand edit.
            raise self.fail(loc, f"unknown field {extra[0]!r}",
                            fix=f"{_UPGRADE}; version-1 files have exactly the fields {list(keys)}")
        return obj

    def name(self, v: Any, loc: str, field: str = "name") -> str:
        if not isinstance(v, str) or not v:
            raise self.fail(loc, f"field {field!r} must be a non-empty string, got {_jtype(v)} {v!r}")
        return v

    def str_list(self, v: Any, loc: str, field: str) -> list[str]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x for x in v):
            raise self.fail(loc, f"field {field!r} must be a list of strings, got {v!r}")
        return list(v)

    # -- values --------------------------------------------------------------------------------
    def value(self, obj: Any, loc: str, *, static: bool) -> Value:
        f = self.fields(obj, _VALUE_KEYS, loc)
        name = self.name(f["name"], loc)
        loc = f"{loc} {name!r}"
        dt = f["dtype"]
        if not isinstance(dt, str) or dt not in _DTYPE_NAMES:
            raise self.fail(loc, f"field 'dtype' is {dt!r}, not a dtype",
                            fix=f"use one of {list(_DTYPE_NAMES)}")
        shape = f["shape"]

        def ok(d: Any) -> bool:
            return (_is_int(d) and d >= 0) or (not static and isinstance(d, str) and _is_dim_str(d))

        if not isinstance(shape, (list, tuple)) or not all(ok(d) for d in shape):
            kind = "non-negative ints" if static else "non-negative ints or symbol names like 'batch'"
            raise self.fail(loc, f"field 'shape' must be a list of {kind}, got {shape!r}")
        problem = _shape_problem(shape, _DTYPE_NAMES[dt])
        if problem is not None:
            raise self.fail(loc, f"field 'shape': {problem}")
        return Value(name, TensorType(_DTYPE_NAMES[dt], tuple(shape)))

    # -- attributes ----------------------------------------------------------------------------
    def attr(self, v: Any, loc: str) -> Any:
        """Invert Graph.structure's encoding: lists -> tuples, {"dtype"} -> DType, {"float"} -> inf/nan."""
        if isinstance(v, Mapping):
            if set(v) == {"dtype"}:
                if isinstance(v["dtype"], str) and v["dtype"] in _DTYPE_NAMES:
                    return _DTYPE_NAMES[v["dtype"]]
                raise self.fail(loc, f"{v['dtype']!r} is not a dtype", fix=f"use one of {list(_DTYPE_NAMES)}")
            if set(v) == {"float"}:
                if v["float"] in _NONFINITE:
                    return float(v["float"])
                raise self.fail(loc, f"{{'float': {v['float']!r}}} is not a non-finite float",
                                fix="only 'inf', '-inf' and 'nan' are encoded this way; finite floats "
                                    "are plain JSON numbers")
            raise self.fail(loc, f"object {dict(v)!r} is not an encoded attribute value",
                            fix='objects encode only dtypes {"dtype": "f32"} and non-finite floats '
                                '{"float": "inf"}')
        if isinstance(v, (list, tuple)):
            return tuple(self.attr(x, f"{loc}[{i}]") for i, x in enumerate(v))
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise self.fail(loc, f"{type(v).__name__} {v!r} is not an attribute value")

    # -- the graph -----------------------------------------------------------------------------
    def graph(self, structure: Any, weights: Mapping[str, Any]) -> Graph:
        top = self.fields(structure, _GRAPH_KEYS, "graph")
        gname = self.name(top["name"], "graph")
        for key in ("inputs", "params", "nodes", "outputs"):
            if not isinstance(top[key], (list, tuple)):
                raise self.fail("graph", f"field {key!r} must be a list, got {_jtype(top[key])}")

        defined: dict[str, str] = {}  # value name -> where it was defined, for duplicate messages

        def define(name: str, loc: str, field: str) -> None:
            if name in defined:
                raise self.fail(loc, f"field {field!r} defines {name!r}, already defined by {defined[name]}",
                                fix="every value name must be unique (SSA); " + _RESAVE)
            defined[name] = loc

        inputs = []
        for i, obj in enumerate(top["inputs"]):
            v = self.value(obj, f"graph input {i}", static=False)
            define(v.name, f"graph input {i} {v.name!r}", "name")
            inputs.append(v)

        params = []
        arrays: dict[str, Any] = {}
        for i, obj in enumerate(top["params"]):
            p = self.value(obj, f"parameter {i}", static=True)
            loc = f"parameter {i} {p.name!r}"
            define(p.name, loc, "name")
            if p.name not in weights:
                raise self.fail(loc, f"the file has no tensor {p.name!r} holding this parameter's weight",
                                fix="the file is incomplete; save the graph again with rlx_core.save")
            w = np.asarray(weights[p.name])
            if w.dtype != p.type.dtype.np:
                st = next((c for d, c in _ST_CODES.items() if d.np == w.dtype), str(w.dtype))
                raise self.fail(loc, f"the stored weight is {st} but field 'dtype' declares {p.type.dtype}",
                                fix="the weights and the graph disagree; " + _RESAVE)
            if w.shape != p.type.shape:
                raise self.fail(loc, f"the stored weight has shape {list(w.shape)} but field 'shape' "
                                     f"declares {list(p.type.shape)}",
                                fix="the weights and the graph disagree; " + _RESAVE)
            params.append(p)
            arrays[p.name] = w
        extra = sorted(set(weights) - set(arrays))
        if extra:
            raise self.fail(f"tensor {extra[0]!r}",
                            "the file stores this tensor but no parameter declares it",
                            fix="the weights and the graph disagree; " + _RESAVE)

        nodes = []
        labels: dict[str, str] = {}  # Node.where -> "node i 'name' (op x)", to index Graph's own errors
        node_names: set[str] = set()
        for i, obj in enumerate(top["nodes"]):
            nodes.append(self.node(i, obj, defined, node_names))
            labels[nodes[-1].where] = f"node {i} {nodes[-1].name!r} (op {nodes[-1].op})"

        outputs = self.str_list(top["outputs"], "graph", "outputs")
        for j, o in enumerate(outputs):
            if o not in defined:
                raise self.fail("graph", f"field 'outputs'[{j}] names {o!r}, which no input, parameter or "
                                         "node defines", fix="name an existing value; " + _RESAVE)
        try:
            graph = Graph(gname, tuple(inputs), tuple(params), tuple(nodes), tuple(outputs), arrays)
        except RLXError as e:  # type inference found a mismatch: keep IR's where/fix, add the index
            loc = e.where or f"graph {gname!r}"
            for prefix, label in labels.items():
                if loc.startswith(prefix):
                    loc = label + loc[len(prefix):]
                    break
            raise SerializationError(f"{loc}: {e.what}", where=self.where, fix=e.fix) from None
        # Node results too (a reshape/expand attribute can ask for 70 axes or a 2**62-wide empty
        # tensor): refused here rather than as NumPy's ValueError inside a backend's compile.
        for i, node in enumerate(graph.nodes):
            for o in node.outputs:
                problem = _shape_problem(graph.types[o].shape, graph.types[o].dtype)
                if problem is not None:
                    raise self.fail(f"node {i} {node.name!r} (op {node.op}), output {o!r}", problem)
        return graph

    def node(self, i: int, obj: Any, defined: dict[str, str], node_names: set[str]) -> Node:
        loc = f"node {i}"
        f = self.fields(obj, _NODE_KEYS, loc)
        name = self.name(f["name"], loc)
        loc = f"node {i} {name!r}"
        if name in node_names:
            raise self.fail(loc, f"field 'name': node name {name!r} is used twice",
                            fix="node names must be unique; " + _RESAVE)
        node_names.add(name)
        op = f["op"]
        if not isinstance(op, str):
            raise self.fail(loc, f"field 'op' must be a string, got {_jtype(op)}")
        if op not in REGISTRY:
            fix = "see `rlx ops` for the op list; load the plugin that provides it first"
            try:
                REGISTRY.get(op)
            except IRError as e:  # reuse the registry's 'did you mean' and plugin hints
                fix = e.fix or fix
            raise self.fail(loc, f"field 'op': unknown op {op!r}", fix=fix)
        ins = self.str_list(f["inputs"], loc, "inputs")
        for j, x in enumerate(ins):
            if x not in defined:
                raise self.fail(loc, f"field 'inputs'[{j}] names {x!r}, which is not defined before "
                                     "this node",
                                fix="nodes must be in topological order and name existing values; "
                                    + _RESAVE)
        outs = self.str_list(f["outputs"], loc, "outputs")
        if not isinstance(f["attrs"], Mapping):
            raise self.fail(loc, f"field 'attrs' must be a JSON object, got {_jtype(f['attrs'])}")
        attrs = {k: self.attr(v, f"{loc}: field 'attrs'.{k}") for k, v in f["attrs"].items()}
        schema = REGISTRY.get(op)
        try:
            checked = schema.check_attrs(attrs, loc)
        except IRError as e:
            raise self.fail(loc, f"field 'attrs': {e.what}", fix=e.fix or _RESAVE) from None
        for j, o in enumerate(outs):
            if o in defined:
                raise self.fail(loc, f"field 'outputs'[{j}] defines {o!r}, already defined by {defined[o]}",
                                fix="every value name must be unique (SSA); " + _RESAVE)
            defined[o] = loc
        return Node(name, op, tuple(ins), tuple(outs), checked)
