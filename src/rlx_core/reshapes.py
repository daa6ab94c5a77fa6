"""Reshapes that undo each other disappear before fusion and dispatch.

Why: importers express an op of lower rank through one of higher rank and reshape around it (the
ONNX importer runs Conv1d / MaxPool1d as 2-D ops on ``(N, C, 1, L)``), so a 1-D conv net becomes
``conv2d -> reshape -> relu -> reshape -> max_pool2d -> reshape -> reshape -> conv2d``: every
backend pays the reshapes, and patterns that look for ``conv -> activation -> pool`` (a backend's
conv fusion, rlx-cpu's conv chains) never see them adjacent. Here

* ``reshape(reshape(x))`` back to ``x``'s shape is ``x``, and
* ``reshape(f(reshape(x)))`` back to ``x``'s shape, where ``f`` is a chain of elementwise ops whose
  other operands are scalars (rank 0), is ``f(x)``: an elementwise op with scalar operands does not
  care about the shape.

Only values nothing else reads are rewritten, and a graph output keeps its name, so the result
computes exactly what the graph did (the same ops on the same elements). Runs with constant folding
(:meth:`rlx_core.runtime.Session.legalize`), so the compile cache's key is the simplified graph.
"""

from __future__ import annotations

from dataclasses import replace

from .ir.graph import Graph, Node
from .ir.schema import REGISTRY


def cancel_reshapes(graph: Graph) -> Graph:
    """``graph`` without the reshape pairs described above (the same object when there are none)."""
    g = graph
    while True:
        nxt = _once(g)
        if nxt is None:
            return g
        g = nxt


def _once(g: Graph) -> Graph | None:
    types, outs = g.types, set(g.outputs)
    prod = {o: n for n in g.nodes for o in n.outputs}
    cons = g.consumers

    def only_reader(v: str, n: Node) -> bool:
        return v not in outs and tuple(c.name for c in cons.get(v, ())) == (n.name,)

    for z in g.nodes:
        if z.op != "reshape" or z.outputs[0] in outs:
            continue
        chain: list[Node] = []  # elementwise nodes from z's input upwards
        v, reader = z.inputs[0], z
        while True:
            p = prod.get(v)
            if p is None or not only_reader(v, reader):
                break
            if p.op == "reshape":
                x = p.inputs[0]
                if types[x] == types[z.outputs[0]]:
                    return _rewrite(g, z, p, chain[::-1], x)
                break
            main = _main_input(g, p)
            if main is None:
                break
            chain.append(p)
            v, reader = main, p
    return None


def _main_input(g: Graph, n: Node) -> str | None:
    """The one non-scalar input of an elementwise node whose output has that input's type."""
    if n.op not in REGISTRY or not REGISTRY.get(n.op).elementwise or len(n.outputs) != 1:
        return None
    big = [v for v in n.inputs if g.types[v].rank != 0]
    if len(set(big)) != 1 or g.types[big[0]] != g.types[n.outputs[0]]:
        return None
    return big[0]


def _rewrite(g: Graph, z: Node, first: Node, chain: list[Node], x: str) -> Graph:
    """Drop ``first`` (x -> reshaped) and ``z`` (back to x's shape); ``chain`` reads ``x``."""
    src = first.outputs[0]
    new_of: dict[str, Node] = {}
    prev_old, prev_new = src, x
    for n in chain:
        ins = tuple(prev_new if v == prev_old else v for v in n.inputs)
        new_of[n.name] = replace(n, inputs=ins)
        prev_old = prev_new = n.outputs[0]
    # z's readers read the chain's last value (x itself where the chain is empty).
    result = prev_new if chain else x
    nodes = []
    for n in g.nodes:
        if n.name in (first.name, z.name):
            continue
        n = new_of.get(n.name, n)
        if z.outputs[0] in n.inputs:
            n = replace(n, inputs=tuple(result if v == z.outputs[0] else v for v in n.inputs))
        nodes.append(n)
    return Graph(g.name, g.inputs, g.params, tuple(nodes), g.outputs, g.weights)
