"""The dispatch contract.

For each node and the chosen backend, in this order:
  1. ``native``    a kernel claim accepts the exact variant (op, dtypes, attributes, shapes);
  2. ``common_ir`` a decomposition into ops that themselves resolve (recursively);
  3. ``rewritten`` a rewrite (e.g. f16 computed in f32) whose result resolves;
  4. otherwise compilation fails with one error listing every illegal node and what was tried.
There is never a silent fallback to another device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DispatchError, IRError, RLXError
from .ir.builder import GraphBuilder, Tensor
from .ir.graph import Graph
from .ir.schema import REGISTRY
from .records import Decomposition, KernelClaim, NodeVariant, Rewrite

MAX_DEPTH = 16
NATIVE, COMMON_IR, REWRITTEN = "native", "common_ir", "rewritten"


@dataclass(frozen=True)
class Plan:
    """How one variant runs: a claim (native) or an expansion whose nodes each have a plan."""

    kind: str
    variant: NodeVariant
    claim: KernelClaim | None = None
    via: str = ""
    sub: Graph | None = None
    children: tuple[Plan, ...] = ()
    cost: float = 0.0

    def kernels(self) -> list[str]:
        if self.claim is not None:
            return [self.claim.name]
        return [k for c in self.children for k in c.kernels()]


@dataclass(frozen=True)
class Illegal:
    """A node no path could place; ``tried`` says what was attempted and why it failed."""

    node: str
    variant: NodeVariant
    backend: str
    tried: tuple[str, ...]

    def describe(self) -> str:
        lines = [f"node {self.node!r}: {self.variant.describe()} on {self.backend}"]
        lines += [f"    tried {t}" for t in self.tried]
        return "\n".join(lines)


@dataclass(frozen=True)
class Assignment:
    """Which claim runs a node of the legalized graph, and where it came from."""

    claim: KernelClaim
    origin: str
    path: str


@dataclass
class Legalized:
    graph: Graph
    assignments: dict[str, Assignment]
    plans: dict[str, Plan]
    outputs: tuple[tuple[str, str], ...]
    backend: str
    device: str
    extra: dict[str, Any] = field(default_factory=dict)


def variant_of(graph: Graph, node: Any) -> NodeVariant:
    return NodeVariant(node.op, tuple(graph.types[i] for i in node.inputs),
                       tuple(graph.types[o] for o in node.outputs), node.attrs)


class Dispatcher:
    """Plans variants for one backend device; plans are memoised per variant."""

    def __init__(self, backend: Any, device: Any, *, cost: Callable[[KernelClaim, NodeVariant], float],
                 decompositions: Sequence[Decomposition], rewrites: Sequence[Rewrite]) -> None:
        self.backend = backend
        self.device = device
        self.claims: Mapping[str, list[KernelClaim]] = backend.claims(device)
        self.cost = cost
        self.decomps: dict[str, list[Decomposition]] = {}
        for d in decompositions:
            self.decomps.setdefault(d.op, []).append(d)
        self.rewrites = list(rewrites)
        self._memo: dict[tuple[NodeVariant, frozenset[str]], Plan | tuple[str, ...]] = {}

    def plan(self, v: NodeVariant, depth: int = 0, banned: frozenset[str] = frozenset()
             ) -> Plan | tuple[str, ...]:
        key = (v, banned)
        if key not in self._memo:
            self._memo[key] = self._plan(v, depth, banned)
        return self._memo[key]

    def _plan(self, v: NodeVariant, depth: int, banned: frozenset[str]) -> Plan | tuple[str, ...]:
        tried: list[str] = []
        claims = self.claims.get(v.op, [])
        for c in claims:
            why = c.check(v)
            if why is None:
                return Plan(NATIVE, v, claim=c, cost=self.cost(c, v))
            tried.append(f"native: {why}")
        if not claims:
            tried.append(f"native: {self.backend.name} has no kernel for {v.op!r}")
        if depth >= MAX_DEPTH:
            tried.append(f"stopped: expansions nested deeper than {MAX_DEPTH} levels")
            return tuple(tried)
        for d in self.decomps.get(v.op, []):
            if d.applies is not None and not d.applies(v):
                continue
            def expand(b: GraphBuilder, ins: list[Tensor], d: Decomposition = d) -> Any:
                return d.expand(b, ins, v.attrs)

            res = self._expand(COMMON_IR, d.name, expand, v, depth, banned)
            if isinstance(res, Plan):
                return res
            tried.append(res)
        for r in self.rewrites:
            if r.name in banned:
                continue
            try:
                ok = r.applies(v)
            except Exception as e:
                tried.append(f"rewrite {r.name}: applies() raised {type(e).__name__}: {e}")
                continue
            if not ok:
                continue
            def rewrite(b: GraphBuilder, ins: list[Tensor], r: Rewrite = r) -> Any:
                return r.apply(b, ins, v)

            res = self._expand(REWRITTEN, r.name, rewrite, v, depth, banned | {r.name})
            if isinstance(res, Plan):
                return res
            tried.append(res)
        return tuple(tried)

    def _expand(self, kind: str, name: str, fn: Callable[[GraphBuilder, list[Tensor]], Any],
                v: NodeVariant, depth: int, banned: frozenset[str]) -> Plan | str:
        label = "decomposition" if kind == COMMON_IR else "rewrite"
        sb = GraphBuilder(f"{v.op}:{name}")
        ins = [sb.input(f"in{i}", t.dtype, t.shape) for i, t in enumerate(v.in_types)]
        try:
            outs = fn(sb, ins)
            outs = [outs] if isinstance(outs, Tensor) else list(outs)
            for o in outs:
                sb._outputs.append(o.name)
            frag = sb.build()
        except RLXError as e:
            return f"{label} {name}: failed to build: {e.what}"
        except Exception as e:  # a buggy plugin decomposition is reported, not fatal
            return f"{label} {name}: raised {type(e).__name__}: {e}"
        got = tuple(frag.types[o] for o in frag.outputs)
        if got != v.out_types:
            return (f"{label} {name}: produced {', '.join(map(str, got))}, expected "
                    f"{', '.join(map(str, v.out_types))}")
        children = []
        for n in frag.nodes:
            p = self.plan(variant_of(frag, n), depth + 1, banned)
            if not isinstance(p, Plan):
                first = p[0] if p else "no path"
                return f"{label} {name}: its {variant_of(frag, n).describe()} has no legal path ({first})"
            children.append(p)
        return Plan(kind, v, via=name, sub=frag, children=tuple(children),
                    cost=sum(c.cost for c in children))


def legalize(graph: Graph, dispatcher: Dispatcher) -> Legalized:
    """Plan every node (collecting all failures), then emit the legalized MIR graph."""
    plans: dict[str, Plan] = {}
    illegal: list[Illegal] = []
    for node in graph.nodes:
        v = variant_of(graph, node)
        p = dispatcher.plan(v)
        if isinstance(p, Plan):
            plans[node.name] = p
        else:
            illegal.append(Illegal(node.name, v, dispatcher.backend.name, p))
    if illegal:
        dev = dispatcher.device.name
        body = "\n".join(i.describe() for i in illegal)
        raise DispatchError(
            f"cannot compile graph {graph.name!r} for {dev}: {len(illegal)} node(s) have no native "
            f"kernel, decomposition or rewrite\n{body}",
            illegal=illegal, where=f"backend {dispatcher.backend.name!r}, device {dev}",
            fix=("cast the inputs to a dtype the backend supports, choose another device, install a "
                 "backend that claims these variants, or register a decomposition through the "
                 "rlx_decompositions hook. RLX never falls back to another device silently."))

    main = GraphBuilder(graph.name)
    env: dict[str, Tensor] = {}
    assignments: dict[str, Assignment] = {}
    for inp in graph.inputs:
        env[inp.name] = main.input(inp.name, inp.type.dtype, inp.type.shape)
    for prm in graph.params:
        env[prm.name] = main.param(prm.name, graph.weights[prm.name])

    def emit(plan: Plan, handles: list[Tensor], origin: str, path: str, name: str | None) -> list[Tensor]:
        v = plan.variant
        if plan.claim is not None:
            nname = name if name is not None and name not in main._types else main.fresh(f"{origin}/{v.op}")
            out = main.op(v.op, *handles, name=nname, **dict(v.attrs))
            outs = list(out) if isinstance(out, tuple) else [out]
            assignments[nname] = Assignment(plan.claim, origin, path)
            return outs
        assert plan.sub is not None
        frag = plan.sub
        local: dict[str, Tensor] = {fi.name: h for fi, h in zip(frag.inputs, handles)}
        for p in frag.params:
            local[p.name] = main.const(frag.weights[p.name], p.type.dtype)
        for n, child in zip(frag.nodes, plan.children):
            res = emit(child, [local[i] for i in n.inputs], origin, path, None)
            local.update(zip(n.outputs, res))
        return [local[o] for o in frag.outputs]

    for node in graph.nodes:
        plan = plans[node.name]
        # A native node keeps its value's name (a named output stays addressable by that name in
        # the program); its origin stays the node's name for reports.
        keep = node.outputs[0] if len(node.outputs) == 1 else node.name
        outs = emit(plan, [env[i] for i in node.inputs], node.name, plan.kind, keep)
        for o, t in zip(node.outputs, outs):
            env[o] = t
    out_map = tuple((o, env[o].name) for o in graph.outputs)
    main._outputs = list(dict.fromkeys(env[o].name for o in graph.outputs))
    try:
        legal = main.build()
    except IRError as e:  # pragma: no cover - an expansion that passed planning must build
        raise DispatchError(f"internal error emitting the legalized graph: {e.what}", where=e.where,
                            fix="please report this with the graph") from e
    return Legalized(legal, assignments, plans, out_map, dispatcher.backend.name, dispatcher.device.name)


__all__ = ["COMMON_IR", "NATIVE", "REGISTRY", "REWRITTEN", "Assignment", "Dispatcher", "Illegal",
           "Legalized", "Plan", "legalize", "variant_of"]
