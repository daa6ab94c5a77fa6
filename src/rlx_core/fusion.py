"""Device-independent fusion: chains of elementwise MIR ops become one ``fused_elementwise`` node.

A fused node carries its sub-program as a JSON attribute, so any backend can render it (the
shared C-style renderer in :mod:`rlx_core.codegen` turns it into C, CUDA, Metal, GLSL, OpenCL,
WGSL or Numba source). It is an HIR op whose decomposition is the original chain, so a backend
that does not claim it loses nothing: the pass only forms a group when the backend's dispatcher
resolves the fused variant *natively*, and the dispatch report shows every fused group.

Grouping rule: starting from a sink, absorb elementwise producers whose output has the sink's
shape and is consumed only inside the group (and is not a graph output). Inputs may broadcast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import IRError
from .ir.graph import Graph, Node
from .ir.schema import REGISTRY, AttrSpec, OpSchema, register_op
from .ir.types import Attrs, TensorType
from .records import FusionRule, Region

FUSED = "fused_elementwise"


def is_fusible(op: str) -> bool:
    """Whether ``op`` may join a fused program: its schema says ``fusion="elementwise"`` (single
    output, shape-preserving up to broadcast, with a C-style ``expr`` for every renderer)."""
    return op in REGISTRY and REGISTRY.get(op).fusion == "elementwise"


#: The fusible ops registered when this module was imported (the core's elementwise MIR ops);
#: :func:`is_fusible` also answers for ops registered later.
FUSIBLE = frozenset(s.name for s in REGISTRY.schemas() if s.fusion == "elementwise")


def _attr_to_json(v: Any) -> Any:
    if isinstance(v, DType):
        return {"dtype": v.value}
    return v


def _attr_from_json(v: Any) -> Any:
    if isinstance(v, dict) and "dtype" in v:
        return DType(v["dtype"])
    return v


def decode(program: str) -> tuple[list[tuple[str, list[str], dict[str, Any]]], str]:
    """``(ops, out)`` where each op is ``(name, args, attrs)``; args are ``i<k>`` (fused-node input k)
    or ``t<j>`` (result of op j); ``out`` names the result."""
    d = json.loads(program)
    ops = [(o[0], list(o[1]), {k: _attr_from_json(v) for k, v in o[2].items()}) for o in d["ops"]]
    return ops, d["out"]


def encode(ops: Sequence[tuple[str, Sequence[str], dict[str, Any]]], out: str) -> str:
    return json.dumps({"ops": [[n, list(a), {k: _attr_to_json(v) for k, v in at.items()}]
                               for n, a, at in ops], "out": out}, separators=(",", ":"))


def _walk(ops: Sequence[tuple[str, list[str], dict[str, Any]]], out: str, inputs: Sequence[Any],
          apply: Callable[[str, list[Any], dict[str, Any]], Any]) -> Any:
    env: dict[str, Any] = {f"i{k}": x for k, x in enumerate(inputs)}
    for j, (name, args, attrs) in enumerate(ops):
        env[f"t{j}"] = apply(name, [env[a] for a in args], attrs)
    return env[out]


def _infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    ops, out = decode(attrs["program"])  # type: ignore[arg-type]
    for name, _, _ in ops:
        if not is_fusible(name):
            raise IRError(f"{FUSED} program contains non-fusible op {name!r}",
                          fix="a fused program holds only ops whose schema has fusion='elementwise'"
                              f" (core: {', '.join(sorted(FUSIBLE))})")

    def apply(name: str, args: list[TensorType], a: dict[str, Any]) -> TensorType:
        schema = REGISTRY.get(name)
        return schema.infer(args, schema.check_attrs(a, f"{FUSED} op {name}"))[0]

    return [_walk(ops, out, ts, apply)]


def _reference(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from .dtypes import reference_np_dtype

    ops, out = decode(attrs["program"])  # type: ignore[arg-type]
    # Computed in float64 end to end: a fused kernel keeps intermediates in registers.

    def apply(name: str, args: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
        schema = REGISTRY.get(name)
        return np.asarray(schema.reference(args, schema.check_attrs(a, FUSED))[0])

    res = _walk(ops, out, list(xs), apply)
    return [res.astype(reference_np_dtype(DType.parse(res.dtype))) if res.dtype.kind != "V" else res]


def _decompose(b: Any, inputs: list[Any], attrs: Attrs) -> list[Any]:
    ops, out = decode(attrs["program"])  # type: ignore[arg-type]
    return [_walk(ops, out, inputs, lambda n, a, at: b.op(n, *a, **at))]


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    ops, _ = decode(attrs["program"])  # type: ignore[arg-type]
    return float(outs[0].numel() * len(ops))


register_op(OpSchema(FUSED, ("xs*",), _infer, _reference,
                     attrs=(AttrSpec("program", "str", doc="JSON sub-program (see rlx_core.fusion)"),),
                     level="hir", category="fused", decompose=_decompose, flops=_flops,
                     doc="a chain of elementwise ops run as one kernel (formed by rlx_core.fusion)"))


def elementwise_groups(graph: Graph) -> list[list[Node]]:
    """Maximal fusible groups (each in topological order, sink last), size >= 2."""
    consumers = graph.consumers
    outputs = set(graph.outputs)
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    producers = graph.producers
    taken: set[str] = set()
    groups: list[list[Node]] = []
    for sink in reversed(graph.nodes):
        if sink.name in taken or not is_fusible(sink.op) or len(sink.outputs) != 1:
            continue
        shape = graph.types[sink.outputs[0]].shape
        members = {sink.name: sink}
        frontier = [sink]
        while frontier:
            n = frontier.pop()
            for i in n.inputs:
                p = producers.get(i)
                if p is None or p.name in members or p.name in taken or not is_fusible(p.op):
                    continue
                if i in outputs or graph.types[i].shape != shape:
                    continue
                if not all(c.name in members for c in consumers.get(i, ())):
                    continue
                members[p.name] = p
                frontier.append(p)
        if len(members) >= 2:
            # Consumers that joined later may have made earlier rejections acceptable; one more
            # pass is not needed for correctness (groups are only ever smaller than maximal).
            ordered = sorted(members.values(), key=lambda n: pos[n.name])
            groups.append(ordered)
            taken.update(members)
    return groups


def fuse_group(graph: Graph, group: Sequence[Node]) -> Node:
    inside = {o for n in group for o in n.outputs}
    ext: list[str] = []
    names: dict[str, str] = {}
    ops = []
    for j, n in enumerate(group):
        args = []
        for i in n.inputs:
            if i in inside:
                args.append(names[i])
            else:
                if i not in ext:
                    ext.append(i)
                args.append(f"i{ext.index(i)}")
        ops.append((n.op, args, dict(n.attrs)))
        names[n.outputs[0]] = f"t{j}"
    sink = group[-1]
    return Node(sink.name, FUSED, tuple(ext), sink.outputs,
                Attrs({"program": encode(ops, names[sink.outputs[0]])}))


def find_elementwise(graph: Graph) -> list[Region]:
    """The elementwise rule: one region per maximal fusible chain, replaced by one fused node."""
    return [Region(tuple(n.name for n in grp), (fuse_group(graph, grp),))
            for grp in elementwise_groups(graph)]


#: Chains of elementwise ops, after legalization (so decomposed HIR ops fuse too).
ELEMENTWISE = FusionRule("elementwise", find_elementwise, stage="legal", provider="rlx_core",
                         doc="chains of elementwise ops with one shape become one fused_elementwise node")


def fuse(graph: Graph, accept: Callable[[Graph, Node], bool] | None = None) -> tuple[Graph, list[list[str]]]:
    """Return the graph with fusible groups replaced, and the fused groups (node names).

    ``accept(graph, fused_node)`` decides per group (e.g. "the backend runs it natively");
    ``None`` accepts every group. The session applies the same rule through
    :mod:`rlx_core.regions`, with the backend's claims deciding.
    """
    from . import regions

    new, taken = regions.apply(graph, [ELEMENTWISE], "legal",
                               lambda n, ins, outs: accept is None or accept(graph, n))
    return new, regions.groups(taken, graph)
