"""Staged execution of ONNX models whose shapes depend on run-time values.

An RLX graph has static shapes per symbol binding, so a node whose output *shape* depends on a tensor
computed at run time cannot be one graph: ``ReduceSum(x, axes)`` with ``axes`` fed at run time,
``Reshape``/``Expand``/``Tile``/``Slice``/``Pad``/``Range``/``TopK`` ... with run-time shape, count or
limit inputs, and ops whose output size depends on the data (``NonZero``, ``Compress`` with a run-time
condition, ``Unique``, ``NonMaxSuppression``). The importer says precisely which:
:class:`~rlx_core.frontends.onnx.RuntimeValueError` names the ONNX tensors whose *values* a node needs,
:class:`~rlx_core.frontends.onnx.DataDependentShapeError` names the node whose output shape depends on
data. :func:`load_onnx_model` turns such a model into a :class:`StagedModel` that, at run time, cuts the
ONNX graph at that boundary:

* **stage 1**: the nodes that compute the boundary tensors, imported with ``load_onnx`` (staged again
  if needed) and compiled on the chosen device; any of its tensors a later node needs is an output,
  so stage 1 is never recomputed;
* **shape values** (small tensors: axes, shapes, sizes, k, limits) become constants of the next stage,
  which is compiled once per distinct value (*value-keyed*). They are also fed to it (``load_onnx``'s
  ``_live``): shapes and attributes read the key, while arithmetic on the value (a window's angles
  from its size, Range's ``start + delta * i``) runs on the backend instead of being folded at import;
* **host ops**: a data-dependent op runs on the host between the stages, with onnx's NumPy reference
  implementation (exactly ONNX's semantics); its outputs are *run-time inputs* of the next stage, which
  is compiled once per distinct output shape, so new data of the same shape does not recompile;
* **bounded ops**: ``NonZero``, ``NonMaxSuppression`` and ``Compress`` run on the backend instead
  where it claims the bounded IR op (``nonzero``, ``non_max_suppression``: the result padded to its
  upper bound, plus a count; :mod:`rlx_core.frontends.onnx_bounded`): the stage before the cut computes
  them and the cut trims the padded result to the count, feeding the next stage as a host op's outputs
  would be;
* **shape-specialised**: a dynamic-axes model whose shapes the IR cannot hold symbolically
  (:class:`~rlx_core.frontends.onnx.SymbolicShapeError`) is imported again with the actual input shapes
  bound, once per input-shape signature; a sequence input's signature is its length and its elements'
  dtypes and shapes (the list is fed as one tensor input per element, and a sequence output comes back
  as a list: :mod:`rlx_core.frontends.onnx_seq`).

Compiled stages are kept in a bounded LRU per boundary (``RLX_ONNX_STAGED_CACHE``). Nothing is hidden:
:meth:`StagedModel.describe` (and ``rlx explain`` / ``rlx run`` of such a model) lists the stages, the
host-evaluated ops and the value-keyed inputs; ``host_ops=False`` refuses host ops at compile time,
naming the node. A model that needs no staging is a plain :class:`~rlx_core.runtime.Executable`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError, RLXError
from ..ir.builder import GraphBuilder, Tensor
from .onnx import (
    _HANDLERS,
    DataDependentShapeError,
    RuntimeValueError,
    SymbolicShapeError,
    UnsupportedOnnxError,
    _handler,
    _Importer,
    load_onnx,
    read_model,
)
from .onnx_bounded import DOMAIN as _BOUNDED_DOMAIN
from .onnx_bounded import BoundedShapeError, boundary, bounded_by, replacement, trim
from .onnx_seq import (
    bind_sequences,
    flatten_feed,
    is_sequence_input,
    normalize_feed,
    pack_outputs,
    sequence_value_info,
    signature,
)

#: Ops whose output shape depends on their input data: run on the host between compiled stages (NonZero,
#: NonMaxSuppression and Compress run on the backend instead where it claims their bounded form).
HOST_OPS = ("NonZero", "Unique", "NonMaxSuppression", "Compress")
#: A value-keyed tensor larger than this is refused: compiling per value of a data tensor would
#: recompile on every run, which is not what a shape value is.
MAX_VALUE_ELEMENTS = 4096
#: Boundaries found one after another before the model is refused (each one freezes more of it;
#: torchvision's RetinaNet post-processing has ~50: a NonZero, TopK and value chain per FPN level).
MAX_DEPTH = 128

_compress_const = _HANDLERS.get("Compress")


def _data_dependent(imp: _Importer, node: Any, what: str) -> DataDependentShapeError:
    label = node.name or node.op_type
    return DataDependentShapeError(
        f"{node.op_type} {what}: its output shape depends on the input data, which one RLX graph (static "
        f"shapes per signature) cannot express", where=imp.node_where,
        fix="compile it with staged execution: rlx_core.frontends.onnx.load_onnx_model(path) (used by "
            "`rlx run` and the ONNX backend), which runs this node on the host between compiled stages",
        node=label, outputs=[o for o in node.output])


@_handler("NonZero", "Unique", "NonMaxSuppression")
def _host_op(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    if not any(isinstance(v, Tensor) for v in ins if v is not None):
        # Constant inputs fold at import unless they exceed the folding budget; that refusal stands.
        raise imp.unsupported(f"{node.op_type} on constants larger than the import's folding budget "
                              f"({imp.fold_refused or 'over budget'})", fix=imp.budget.fix)
    boundary(imp, node, ins, attrs)  # raises BoundedShapeError where the backend runs it bounded
    raise _data_dependent(imp, node, "on a run-time tensor")


@_handler("Compress")
def _compress(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    if len(ins) > 1 and isinstance(ins[1], Tensor):
        boundary(imp, node, ins, attrs)  # raises BoundedShapeError where the backend runs it bounded
        raise _data_dependent(imp, node, "with a condition computed at run time")
    if _compress_const is None:  # pragma: no cover - onnx_index registers it first
        raise imp.unsupported("Compress is not translated", fix="select with Gather on constant indices")
    return list(_compress_const(imp, node, ins, attrs))


# ---------------------------------------------------------------------------------------------
# Graph surgery on ONNX protos


def _subgraph_refs(node: Any) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope (a superset)."""
    out: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                out.update(i for i in n.input if i and i not in defined)
                out |= _subgraph_refs(n) - defined
                defined.update(n.output)
    return out


def _defined_in_subgraphs(node: Any) -> set[str]:
    out: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                out.update(o for o in n.output if o)
                out |= _defined_in_subgraphs(n)
    return out


def _reads(node: Any) -> set[str]:
    return {i for i in node.input if i} | _subgraph_refs(node)


def _slice(nodes: Sequence[Any], targets: Iterable[str]) -> set[int]:
    """Indices of the nodes needed to compute ``targets``."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    keep: set[int] = set()
    stack = [t for t in targets]
    while stack:
        k = producer.get(stack.pop())
        if k is None or k in keep:
            continue
        keep.add(k)
        stack.extend(_reads(nodes[k]))
    return keep


def _inline_ifs(nodes: Sequence[Any], values: Mapping[str, np.ndarray], inits: list[Any]) -> list[Any]:
    """Replace each If whose condition is now a known value by its taken branch's nodes (the branch's
    tensors become top-level, so a later boundary can be cut inside it)."""
    from onnx import helper

    out: list[Any] = []
    for n in nodes:
        cond = values.get(n.input[0]) if n.op_type == "If" and n.input else None
        if cond is None or cond.size != 1:
            out.append(n)
            continue
        want = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = next(a.g for a in n.attribute if a.name == want)
        inits.extend(branch.initializer)
        out.extend(branch.node)
        out.extend(helper.make_node("Identity", [b.name], [o], name=f"{n.name or 'If'}/{o}")
                   for b, o in zip(branch.output, n.output) if o)
    return out


def _vi(name: str, arr: Any) -> Any:
    from onnx import helper

    if isinstance(arr, list):  # a sequence carried to the next stage (onnx_seq)
        return sequence_value_info(name, arr)
    arr = np.asarray(arr)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _model(template: Any, nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[str],
           initializers: Sequence[Any], name: str) -> Any:
    from onnx import ModelProto, ValueInfoProto, helper

    graph = helper.make_graph(list(nodes), name, list(inputs), [ValueInfoProto(name=o) for o in outputs],
                              initializer=list(initializers))
    m = ModelProto()
    m.ir_version = template.ir_version
    m.opset_import.extend(template.opset_import)
    if any(n.domain == _BOUNDED_DOMAIN for n in nodes) and \
            all(o.domain != _BOUNDED_DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(_BOUNDED_DOMAIN, 1))
    m.graph.CopyFrom(graph)
    return m


def _key_of(arrays: Mapping[str, np.ndarray], by_value: Iterable[str] = ()) -> tuple[Any, ...]:
    vals = set(by_value)
    return tuple((n, "seq", signature(a), None) if isinstance(a, list) else
                 (n, str(a.dtype), a.shape, a.tobytes() if n in vals else None)
                 for n, a in sorted(arrays.items()))


def _independent(graph: Any) -> set[str]:
    """Outputs of a graph that no graph input reaches (computed at import time)."""
    live = {v.name for v in graph.inputs}
    for node in graph.nodes:
        if any(i in live for i in node.inputs):
            live.update(node.outputs)
    return {o for o in graph.outputs if o not in live}


# ---------------------------------------------------------------------------------------------
# Stages


class _LRU:
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, _Stage] = OrderedDict()

    def get(self, key: Any) -> _Stage | None:
        hit = self.items.get(key)
        if hit is not None:
            self.items.move_to_end(key)
        return hit

    def put(self, key: Any, stage: _Stage) -> None:
        self.items[key] = stage
        while len(self.items) > self.size:
            self.items.popitem(last=False)


class _Stage:
    """One ONNX proto: a plain compiled graph, or a boundary with the stages around it."""

    def __init__(self, owner: StagedModel, proto: Any, label: str, depth: int = 0,
                 live: Sequence[str] = ()) -> None:
        self.owner = owner
        self.proto = proto
        #: Value-keyed tensors this proto has as initializers and also takes as inputs, fed the same
        #: value at run: arithmetic on them runs on the backend (load_onnx's ``_live``).
        self.live = tuple(live)
        self.label = label
        self.depth = depth
        self.kind = ""
        self.graph: Any = None
        self.exe: Any = None
        self.error: UnsupportedOnnxError | None = None
        self.needed: tuple[str, ...] = ()         # value-keyed tensors ("values")
        self.host: Any = None                     # the host node ("host"), the bounded one ("bounded")
        self.stage1: _Stage | None = None
        self.carried: tuple[str, ...] = ()        # stage-1 tensors fed to the next stage as inputs
        self.s1_nodes: set[int] = set()
        self.variants = _LRU(owner.cache_size)
        self.independent: set[str] = set()

    # -- analysis ----------------------------------------------------------------------------
    def analyse(self) -> None:
        if self.kind:
            return
        if self.depth > MAX_DEPTH:
            raise UnsupportedOnnxError(f"staging {self.owner.source} found more than {MAX_DEPTH} boundaries "
                                       f"one after another", where=self.label,
                                       fix="export with constant shapes for most of the model")
        try:
            with bounded_by(self.owner.bounded_check if self.owner.bounded_ops else None):
                self.graph = load_onnx(self.proto, _live=self.live, **self.owner.load_kw)
            self.kind = "graph"
            self.independent = _independent(self.graph)
            return
        except RuntimeValueError as e:
            self.error = e
            self._plan_values(e)
        except DataDependentShapeError as e:
            self.error = e
            self._plan_host(e)
        except SymbolicShapeError as e:
            if not self._has_dynamic_inputs():
                raise
            self.error, self.kind = e, "shapes"

    def _has_dynamic_inputs(self) -> bool:
        inits = {t.name for t in self.proto.graph.initializer}
        return any(not d.HasField("dim_value") for vi in self.proto.graph.input if vi.name not in inits
                   for d in vi.type.tensor_type.shape.dim) or \
            any(is_sequence_input(vi) for vi in self.proto.graph.input)  # imported per fed length

    def _graph_inputs(self) -> set[str]:
        inits = {t.name for t in self.proto.graph.initializer}
        return {vi.name for vi in self.proto.graph.input if vi.name not in inits}

    def _split(self, targets: Sequence[str], nodes: Sequence[Any] | None = None) -> None:
        """Stage 1: the nodes computing ``targets``; ``carried``: its tensors the rest reads.
        ``nodes``: the proto's nodes with the bounded node's replacement in its place."""
        nodes = self.proto.graph.node if nodes is None else nodes
        self.s1_nodes = _slice(nodes, targets)
        rest_reads: set[str] = set()
        for k, n in enumerate(nodes):
            if k not in self.s1_nodes and n is not self.host:
                rest_reads |= _reads(n)
        outs = {o.name for o in self.proto.graph.output}
        produced = [o for k in sorted(self.s1_nodes) for o in nodes[k].output if o]
        self.carried = tuple(o for o in produced if o in rest_reads or o in outs)
        s1_outs = list(dict.fromkeys([t for t in targets if t in produced] + list(self.carried)))
        if not self.s1_nodes:
            self.stage1 = None
            return
        s1 = [nodes[k] for k in sorted(self.s1_nodes)]
        reads: set[str] = set()
        for n in s1:
            reads |= _reads(n)
        g = self.proto.graph
        ins = [vi for vi in g.input if vi.name in reads and vi.name in self._graph_inputs()]
        inits = [t for t in g.initializer if t.name in reads]
        proto = _model(self.proto, s1, ins, s1_outs, inits, f"{g.name or 'model'}_stage1")
        self.stage1 = _Stage(self.owner, proto, f"{self.label}/stage1", self.depth + 1)
        self.stage1.analyse()

    def _plan_values(self, e: RuntimeValueError) -> None:
        produced = {o for n in self.proto.graph.node for o in n.output if o}
        known = produced | self._graph_inputs()
        needed: list[str] = []
        for t in e.tensors:
            if t in known:
                needed.append(t)
                continue
            # Computed inside an If branch: with the If's condition known, the branch is inlined
            # at import and its tensors can be cut at in the next round.
            owner = next((n for n in self.proto.graph.node if n.op_type == "If" and n.input
                          and t in _defined_in_subgraphs(n)), None)
            if owner is None:
                raise e  # inside a loop body, or unknown: no top-level boundary to cut at
            needed.append(owner.input[0])
        if not needed:
            raise e
        self.kind, self.needed = "values", tuple(dict.fromkeys(needed))
        self._split(self.needed)

    def _plan_host(self, e: DataDependentShapeError) -> None:
        nodes = self.proto.graph.node
        hit = [n for n in nodes if tuple(n.output) == e.outputs]
        if not hit:
            raise e  # inside a subgraph (If/Loop body): no top-level boundary to cut at
        self.host = hit[0]
        if isinstance(e, BoundedShapeError):
            # Computed in stage 1 by the backend (padded + count); the cut trims it (run()).
            self.kind = "bounded"
            nodes = [replacement(n) if n is self.host else n for n in self.proto.graph.node]
            self._split(list(replacement(self.host).output), nodes)
            return
        if not self.owner.host_ops:
            raise UnsupportedOnnxError(
                f"{self.host.op_type} node {e.node!r} has a data-dependent output shape: it would run on the "
                f"host (NumPy) between compiled stages, and host ops are disallowed for this model",
                where=e.where,
                fix="allow host ops: load_onnx_model(path, host_ops=True) (the default), or export the "
                    "model without data-dependent shapes (e.g. a fixed-size mask instead of NonZero)")
        self.kind = "host"
        self._split([i for i in self.host.input if i])

    # -- running -----------------------------------------------------------------------------
    def run(self, feed: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """All graph outputs of this proto, and where each was computed ("backend" or "host")."""
        self.analyse()
        if self.kind == "graph":
            if self.exe is None:
                self.exe = self.owner.session.compile(self.graph)
                self.owner.compiles += 1
            names = {v.name for v in self.graph.inputs}
            out = self.exe.run({k: v for k, v in feed.items() if k in names})
            # A sequence output's elements are outputs y[0], y[1] ...: returned as one list (onnx_seq).
            return pack_outputs([o.name for o in self.proto.graph.output], out, self.independent)
        if self.kind == "shapes":
            shapes = {vi.name: signature(feed[vi.name]) for vi in self.proto.graph.input
                      if vi.name in self._graph_inputs() and vi.name in feed}
            key = tuple(sorted(shapes.items()))
            st = self.variants.get(key)
            if st is None:
                st = _Stage(self.owner, self._bound(shapes), f"{self.label}[shapes {key}]", self.depth + 1,
                            live=self.live)
                self.variants.put(key, st)
            return st.run(flatten_feed(feed))  # a sequence is its elements' inputs x[0] ... there
        env: dict[str, np.ndarray] = dict(feed)
        origin: dict[str, str] = {k: "host" for k in feed}
        if self.stage1 is not None:
            s1_out, s1_origin = self.stage1.run(feed)
            env.update(s1_out)
            origin.update(s1_origin)
        outs = [o.name for o in self.proto.graph.output]
        result = {o: env[o] for o in outs if o in env}
        res_origin = {o: origin[o] for o in result}
        inputs: dict[str, np.ndarray] = {}
        if self.kind == "values":
            values = {t: self._value(env, t) for t in self.needed}
            big = [t for t, a in values.items() if a.size > MAX_VALUE_ELEMENTS]
            if big:
                assert self.error is not None
                if getattr(self.error, "speculative", False):
                    raise self.error
                raise UnsupportedOnnxError(
                    f"{self.error.what}; the value-keyed tensor(s) {', '.join(big)} have more than "
                    f"{MAX_VALUE_ELEMENTS} elements", where=self.error.where,
                    fix="a shape value is small; export with it constant")
            carried = {c: env[c] for c in self.carried if c not in values}
            key = _key_of({**values, **carried}, values)
            inputs = carried
        else:
            if self.kind == "bounded":
                padded, count = replacement(self.host).output
                host_out = {self.host.output[0]: trim(self.host, env[padded], env[count])}
                where = origin.get(padded, "backend")  # a slice of the backend's padded result
            else:
                host_out, where = self._run_host(env), "host"
            env.update(host_out)
            for o, a in host_out.items():
                if o in outs:
                    result[o], res_origin[o] = a, where
            carried = {c: env[c] for c in self.carried}
            inputs = {**carried, **host_out}
            values = {}
            key = _key_of(inputs)
        rest_outs = [o for o in outs if o not in result]
        if not rest_outs:
            return result, res_origin
        st = self.variants.get(key)
        if st is None:
            keyed = [f"{n}={a.reshape(-1).tolist()[:8]}" for n, a in values.items()] + \
                [f"{n}: {a.dtype}{list(a.shape)}" for n, a in inputs.items()]
            st = _Stage(self.owner, self._rest(values, inputs, rest_outs),
                        f"{self.label}/stage2[{', '.join(keyed)}]", self.depth + 1,
                        live=tuple(dict.fromkeys([*values, *self.live])))
            self.variants.put(key, st)
        rest_feed = {k: v if isinstance(v, list) else np.asarray(v)
                     for k, v in {**feed, **inputs, **values}.items()}
        out2, origin2 = st.run(rest_feed)
        for o in rest_outs:
            result[o], res_origin[o] = out2[o], origin2.get(o, "host")
        return result, res_origin

    def _value(self, env: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        if name in env:
            return np.asarray(env[name])
        raise InputError(f"the value of {name!r} is needed to compile the next stage but was not computed",
                         where=self.label, fix="pass every model input")

    def _initializer(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        for t in self.proto.graph.initializer:
            if t.name == name:
                return np.asarray(numpy_helper.to_array(t))
        return None

    def _run_host(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The data-dependent node with onnx's NumPy reference implementation (ONNX's semantics)."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        node = self.host
        feeds: dict[str, np.ndarray] = {}
        for i in node.input:
            if not i:
                continue
            a = env.get(i)
            if a is None:
                a = self._initializer(i)
            if a is None:
                raise InputError(f"input {i!r} of host op {node.op_type} was not computed", where=self.label,
                                 fix="pass every model input")
            feeds[i] = np.asarray(a)
        vis = [_vi(n, a) for n, a in feeds.items()]
        outs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
        m = helper.make_model(helper.make_graph([node], "host_op", vis, outs),
                              opset_imports=list(self.proto.opset_import))
        m.ir_version = self.proto.ir_version
        res = ReferenceEvaluator(m).run(None, feeds)
        return {o: np.asarray(r) for o, r in zip([o for o in node.output if o], res)}

    def _rest(self, values: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
              outs: Sequence[str]) -> Any:
        from onnx import numpy_helper

        g = self.proto.graph
        skip = set(self.s1_nodes)
        nodes = [n for k, n in enumerate(g.node) if k not in skip and n is not self.host]
        vis = [vi for vi in g.input if vi.name in self._graph_inputs() and vi.name not in values
               and vi.name not in inputs]
        vis += [_vi(n, a) for n, a in inputs.items()]
        inits = [t for t in g.initializer if t.name not in values and t.name not in inputs]
        inits += [numpy_helper.from_array(np.asarray(a), n) for n, a in values.items()]
        vis += [_vi(n, a) for n, a in values.items()]  # also fed: live (load_onnx's _live)
        vis += [vi for vi in g.input if vi.name in self.live and vi.name not in values]  # still fed
        nodes = _inline_ifs(nodes, values, inits)
        return _model(self.proto, nodes, vis, outs, inits, f"{g.name or 'model'}_stage2")

    def _bound(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        from onnx import ModelProto

        m = ModelProto()
        m.CopyFrom(self.proto)
        for vi in m.graph.input:
            if vi.name in shapes and vi.type.HasField("tensor_type"):
                dims = vi.type.tensor_type.shape.dim
                for d, n in zip(dims, shapes[vi.name]):
                    d.ClearField("dim_param")
                    d.dim_value = int(n)
        return bind_sequences(m, shapes)  # a fed sequence becomes its elements' tensor inputs

    # -- reporting ---------------------------------------------------------------------------
    def describe(self, indent: str = "") -> list[str]:
        if not self.kind:
            return [f"{indent}{self.label}: not analysed yet"]
        if self.kind == "graph":
            state = "compiled" if self.exe is not None else "compiled on first run"
            return [f"{indent}{self.label}: one RLX graph, {len(self.graph.nodes)} node(s), {state} on "
                    f"{self.owner.device}"]
        lines: list[str] = []
        where = self.error.where if self.error is not None else ""
        if self.kind == "shapes":
            lines.append(f"{indent}{self.label}: shape-specialised: imported again per input-shape "
                         f"signature ({len(self.variants.items)} cached), because "
                         f"{self.error.what if self.error else ''}")
        elif self.kind == "values":
            spec = " (speculative: the node refused while they were run-time tensors)" \
                if getattr(self.error, "speculative", False) else ""
            lines.append(f"{indent}{self.label}: value-keyed input(s) {', '.join(self.needed)} of node "
                         f"{getattr(self.error, 'node', '?')!r}{spec}: computed first, then compiled in as "
                         f"constants, one compiled stage per distinct value ({len(self.variants.items)} "
                         f"cached); at {where}")
        elif self.kind == "bounded":
            lines.append(f"{indent}{self.label}: bounded op {self.host.op_type} node "
                         f"{self.host.name or self.host.op_type!r} runs on {self.owner.device} in the stage "
                         f"before the cut (padded to its upper bound, with a count); the cut trims it and "
                         f"{self.host.output[0]} is a run-time input of the next stage, compiled per shape "
                         f"({len(self.variants.items)} cached)")
        else:
            lines.append(f"{indent}{self.label}: host op {self.host.op_type} node "
                         f"{self.host.name or self.host.op_type!r} runs on the host (NumPy, onnx.reference) "
                         f"between stages; its outputs {', '.join(o for o in self.host.output if o)} are "
                         f"run-time inputs of the next stage, compiled per shape "
                         f"({len(self.variants.items)} cached)")
        if self.stage1 is not None:
            lines += self.stage1.describe(indent + "  ")
        if self.carried:
            lines.append(f"{indent}  fed to the next stage (not recomputed): {', '.join(self.carried)}")
        for st in list(self.variants.items.values())[-3:]:
            lines += st.describe(indent + "  ")
        return lines

    def reports(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if self.exe is not None and getattr(self.exe, "report", None) is not None:
            out.append((self.label, self.exe.report))
        if self.stage1 is not None:
            out += self.stage1.reports()
        for st in self.variants.items.values():
            out += st.reports()
        return out

    def host_ops(self, kind: str = "host") -> list[str]:
        """The data-dependent nodes run on the host (``kind="bounded"``: those the backend runs)."""
        out = [] if self.host is None or self.kind != kind else \
            [f"{self.host.op_type} {self.host.name or self.host.op_type!r}"]
        for st in ([self.stage1] if self.stage1 else []) + list(self.variants.items.values()):
            out += st.host_ops(kind)
        return out


class StagedModel:
    """An ONNX model compiled in stages where one RLX graph cannot hold it (see the module docstring).

    ``run(inputs)`` -> ``{output name: array}``; ``compiles`` counts the graphs compiled so far;
    ``describe()`` lists the stages, host ops and value-keyed inputs; ``reports()`` the dispatch report of
    every compiled stage; ``last_origins`` says, per output of the last run, whether a compiled stage
    ("backend") or the host ("host": a host op, or folded at import from value-keyed constants)
    computed it.
    """

    def __init__(self, model: Any, *, device: str | None = None, session: Any = None, host_ops: bool = True,
                 cache_size: int | None = None, bounded_ops: bool = True, **load_kw: Any) -> None:
        from .. import settings
        from ..runtime import Session

        proto, self.source = read_model(model)
        if proto.functions:
            import onnx.inliner

            proto = onnx.inliner.inline_local_functions(proto)
        if "name" not in load_kw and isinstance(model, (str, os.PathLike)):
            load_kw["name"] = os.path.splitext(os.path.basename(os.fspath(model)))[0]
        self.proto = proto
        self.load_kw = load_kw
        self.host_ops = host_ops
        self.bounded_ops = bounded_ops
        self._bounded_memo: dict[Any, bool] = {}
        self.cache_size = int(cache_size if cache_size is not None else settings.ONNX_STAGED_CACHE.get())
        self.session = session if session is not None else Session(device)
        self.device = self.session.device.name
        self.compiles = 0
        inits = {t.name for t in proto.graph.initializer}
        self.input_names = tuple(vi.name for vi in proto.graph.input if vi.name not in inits)
        self.output_names = tuple(o.name for o in proto.graph.output)
        self.last_origins: dict[str, str] = {}
        self._lock = threading.Lock()  # the stage caches are shared: one run at a time
        self.root = _Stage(self, proto, "model")
        self.root.analyse()  # unsupported operators and refused host ops fail here, at compile time

    def bounded_check(self, op_type: str, types: Sequence[Any], attrs: Mapping[str, Any], emit: Any) -> bool:
        """Does the session's backend run the fragment ``emit`` builds for ONNX ``op_type`` (its bounded
        op) on operands of ``types``: a small graph through the public ``Session.check`` (native,
        decomposed or rewritten on this device; never a fallback elsewhere)."""
        key = (op_type, tuple(types), tuple(sorted(attrs.items())))
        hit = self._bounded_memo.get(key)
        if hit is None:
            try:
                g = GraphBuilder(f"bounded_{op_type}")
                outs = emit(g, [g.input(f"in{i}", t.dtype, t.shape) for i, t in enumerate(types)], attrs)
                for o in outs:
                    g.output(o)
                self.session.check(g.build())
                hit = True
            except RLXError:  # DispatchError: no legal path; ShapeError ...: not this op's variant
                hit = False
            self._bounded_memo[key] = hit
        return hit

    @property
    def staged(self) -> bool:
        """True when the model needs more than one plain graph."""
        return self.root.kind != "graph"

    @property
    def graph(self) -> Any:
        """The RLX graph when the model is one plain graph, else None."""
        return self.root.graph

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        feed = normalize_feed(self.proto, {**dict(inputs or {}), **kw})  # a sequence input: a list
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise InputError(f"missing input(s) {', '.join(missing)}", where=f"ONNX model {self.source}",
                             fix=f"pass every input: {', '.join(self.input_names)}")
        with self._lock:
            out, origin = self.root.run(feed)
            self.last_origins = {o: origin.get(o, "host") for o in self.output_names}
        return {o: out[o] for o in self.output_names}

    def __call__(self, *args: Any, **kw: Any) -> Any:
        out = self.run({**dict(zip(self.input_names, args)), **kw})
        vals = tuple(out[o] for o in self.output_names)
        return vals[0] if len(vals) == 1 else vals

    def describe(self) -> str:
        head = f"{self.source} on {self.device}: " + (
            "one RLX graph (no staging)" if not self.staged else "staged execution")
        lines = [head] + self.root.describe("  ")
        hosts = self.root.host_ops()
        if hosts:
            lines.append(f"  host-evaluated op(s): {', '.join(hosts)}")
        bounded = self.root.host_ops("bounded")
        if bounded:
            lines.append(f"  bounded op(s) on {self.device} (trimmed at the cut): {', '.join(bounded)}")
        return "\n".join(lines)

    def reports(self) -> list[tuple[str, Any]]:
        return self.root.reports()


def load_onnx_model(model: Any, *, device: str | None = None, session: Any = None, host_ops: bool = True,
                    cache_size: int | None = None, bounded_ops: bool = True, **load_kw: Any) -> StagedModel:
    """Compile an ONNX model for ``device`` (or ``session``), staged where needed (module docstring).

    ``load_kw``: :func:`~rlx_core.frontends.onnx.load_onnx`'s keywords (``symbols``, ``input_shapes``,
    ``fuse`` ...). ``host_ops=False``: refuse data-dependent ops on the host (UnsupportedOnnxError naming
    the node). ``cache_size``: compiled stages kept per boundary (default ``RLX_ONNX_STAGED_CACHE``).
    ``bounded_ops=False``: run NonZero/NonMaxSuppression/Compress on the host even where the backend
    claims their bounded IR ops (:mod:`rlx_core.frontends.onnx_bounded`).
    """
    return StagedModel(model, device=device, session=session, host_ops=host_ops, cache_size=cache_size,
                       bounded_ops=bounded_ops, **load_kw)


__all__ = ["HOST_OPS", "MAX_VALUE_ELEMENTS", "StagedModel", "load_onnx_model"]
