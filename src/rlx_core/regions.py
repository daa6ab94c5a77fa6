"""Fusion as regions that backends claim.

A :class:`~rlx_core.records.FusionRule` proposes :class:`~rlx_core.records.Region` s of a graph:
some nodes, and the fewer nodes that replace them. The session's backend decides which regions it
takes the way ONNX Runtime's ``GetCapability`` answers for subgraphs: a region is applied only
where the backend's dispatcher resolves every replacement node it must run natively to one of its
own kernel claims. A rule can therefore never make a graph illegal or move work onto a slower
path, and the dispatch report lists every region taken.

Rules come from the core (elementwise chains, attention) and from plugins through the
``rlx_fusion_rules`` hook; plugin rules are tried first, so a backend's own, larger patterns win
over the generic ones. ``stage="graph"`` rules see the graph as built (before legalization: e.g.
attention written out as primitives); ``stage="legal"`` rules see the legalized graph, so HIR ops
that were decomposed can fuse too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .errors import PluginError, RLXError
from .ir.graph import Graph, Node, infer_node
from .ir.schema import REGISTRY
from .ir.types import TensorType
from .records import FusionRule, Region

#: ``claims(node, in_types, out_types)``: whether the backend runs this node natively.
Claims = Callable[[Node, Sequence[TensorType], Sequence[TensorType]], bool]


@dataclass(frozen=True)
class Taken:
    """A region the backend claimed: which rule, the nodes it replaced and the new nodes."""

    rule: str
    region: Region


def _where(rule: FusionRule) -> str:
    return f"fusion rule {rule.name!r} (from {rule.provider})"


def _check(graph: Graph, rule: FusionRule, region: Region) -> None:
    """A region must replace existing nodes and still produce every value read outside it."""
    members = set(region.members)
    by_name = {n.name: n for n in graph.nodes}
    missing = [m for m in region.members if m not in by_name]
    if missing:
        raise PluginError(f"a region names nodes the graph does not have: {missing}", where=_where(rule),
                          fix="propose regions over the graph's own node names")
    produced = {o for n in region.nodes for o in n.outputs}
    outputs = set(graph.outputs)
    for m in region.members:
        for v in by_name[m].outputs:
            read_outside = v in outputs or any(c.name not in members for c in graph.consumers.get(v, ()))
            if read_outside and v not in produced:
                raise PluginError(f"a region over {region.members} drops value {v!r}, which is read "
                                  "outside it", where=_where(rule),
                                  fix="let the replacement nodes produce every value read outside the region")


def _placeable(graph: Graph, region: Region, pos: dict[str, int]) -> bool:
    """The replacement goes where the last member was: every value it produces that others read
    must not be read before that point (a consumer between the members would lose its input)."""
    last = max(pos[m] for m in region.members)
    members = set(region.members)
    for n in region.nodes:
        for v in n.outputs:
            if any(c.name not in members and pos[c.name] < last for c in graph.consumers.get(v, ())):
                return False
    return True


def _types(region: Region, known: Mapping[str, TensorType]) -> dict[str, TensorType] | None:
    """Types of the replacement nodes' values, inferred in order; ``None`` if a node is not valid
    (an op nobody registered, inputs of the wrong type: the region is not taken)."""
    types: dict[str, TensorType] = {}
    for n in region.nodes:
        if n.op not in REGISTRY:
            return None
        if all(o in known for o in n.outputs) and all(i in known or i in types for i in n.inputs):
            # A value keeps its type (checked after the rebuild): no inference needed to ask.
            types.update((o, known[o]) for o in n.outputs)
            continue
        try:
            ins = [types[i] if i in types else known[i] for i in n.inputs]
            outs = infer_node(REGISTRY.get(n.op), n, ins)
        except (KeyError, RLXError):
            return None
        types.update(zip(n.outputs, outs, strict=True))
    return types


def apply(graph: Graph, rules: Sequence[FusionRule], stage: str, claims: Claims) -> tuple[Graph, list[Taken]]:
    """The graph with every claimed region of ``stage``'s rules replaced, and the regions taken.

    Regions never overlap: a node belongs to the first claimed region (rule order, then the
    rule's own order) that contains it.
    """
    taken: list[Taken] = []
    used: set[str] = set()
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    for rule in rules:
        if rule.stage != stage:
            continue
        try:
            regions = list(rule.find(graph))
        except RLXError:
            raise
        except Exception as e:  # a broken plugin rule names itself, it does not crash the compile
            raise PluginError(f"find() raised {type(e).__name__}: {e}", where=_where(rule),
                              fix="fix the rule, or uninstall the plugin that provides it") from e
        for region in regions:
            if not isinstance(region, Region):
                raise PluginError(f"find() returned {region!r}", where=_where(rule),
                                  fix="return a list of rlx_core.plugin.Region")
            if used.intersection(region.members):
                continue
            _check(graph, rule, region)
            if not _placeable(graph, region, pos):
                continue
            new_types = _types(region, graph.types)
            if new_types is None:
                continue
            # After legalization every node must already be a kernel: the whole region is claimed.
            every = tuple(n.name for n in region.nodes)
            must = every if stage == "legal" or region.claim is None else region.claim
            ok = True
            for n in region.nodes:
                if n.name in must:
                    ins = [new_types.get(i) or graph.types[i] for i in n.inputs]
                    if not claims(n, ins, [new_types[o] for o in n.outputs]):
                        ok = False
                        break
            if not ok:
                continue
            used.update(region.members)
            taken.append(Taken(rule.name, region))
    if not taken:
        return graph, []
    new = rebuild(graph, [t.region for t in taken])
    for t in taken:
        for n in t.region.nodes:
            for o in n.outputs:
                if o in graph.types and new.types[o] != graph.types[o]:
                    raise PluginError(f"region replacing {t.region.members} changes the type of {o!r} from "
                                      f"{graph.types[o]} to {new.types[o]}", where=f"fusion rule {t.rule!r}",
                                      fix="a replacement must produce each value with its original type")
    return new, taken


def rebuild(graph: Graph, regions: Sequence[Region]) -> Graph:
    """Replace each region's members by its nodes, placed where its last member was."""
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    at: dict[str, Region] = {}
    drop: set[str] = set()
    for r in regions:
        last = max(r.members, key=pos.__getitem__)
        at[last] = r
        drop.update(r.members)
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.name in at:
            nodes.extend(at[n.name].nodes)
        elif n.name not in drop:
            nodes.append(n)
    return Graph(graph.name, graph.inputs, graph.params, tuple(nodes), graph.outputs, dict(graph.weights))


def groups(taken: Sequence[Taken], graph: Graph) -> list[list[str]]:
    """The replaced node names per region, in graph order (what the dispatch report shows)."""
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    return [sorted(t.region.members, key=lambda m: pos.get(m, 0)) for t in taken]


__all__ = ["Claims", "Taken", "apply", "groups", "rebuild"]
