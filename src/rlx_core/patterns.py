"""Device-independent pattern fusion: scaled dot-product attention written out as primitives.

Exporters (``torch.onnx``, hand-built graphs) spell attention as
``softmax(matmul(q, kt) / c [+ bias]) @ v``. This pass turns each such chain into one HIR
``attention`` node (``mask="bias"`` when a bias is added, ``scale = 1/c``), so a backend with a
native attention kernel runs it without materialising the (B, H, Sq, Sk) scores and probabilities
several times. ``attention`` decomposes back into the same primitives, and the pass only rewrites
where ``accept`` says the backend runs the new node natively, so nothing can become illegal.

Matched (all intermediate values used only inside the chain, none a graph output):
``matmul(q, kt)``, optionally ``div`` by / ``mul`` by a scalar constant parameter, optionally
``add`` of a bias of the scores' dtype (either operand order), ``softmax(axis=-1)``, then
``matmul(p, v)``. ``kt`` is the keys with the last two axes swapped; when it comes from a
transpose, ``k`` is that transpose with its last two axes swapped back (the old one is dropped if
nothing else reads it), otherwise a transpose is inserted.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir.graph import Graph, Node
from .ir.types import Attrs, attr_ints
from .records import FusionRule, Region

Accept = Callable[[Graph, Node], bool]


def _scalar_param(g: Graph, name: str) -> float | None:
    if name not in g.weights:
        return None
    a = np.asarray(g.weights[name])
    return float(a.reshape(())) if a.size == 1 else None


def find_attention(g: Graph) -> list[Region]:
    """One region per attention chain: the chain's nodes, replaced by an ``attention`` node (and
    the keys' transpose it needs); the backend must claim the attention node natively."""
    prod = g.producers
    cons = g.consumers
    outs = set(g.outputs)

    def only_into(v: str, n: Node) -> bool:
        return v not in outs and [c.name for c in cons.get(v, ())] == [n.name]

    regions: list[Region] = []
    taken: set[str] = set()
    for sm in g.nodes:
        if sm.op != "softmax" or sm.attrs.get("axis") not in (-1, g.types[sm.inputs[0]].rank - 1):
            continue
        p = sm.outputs[0]
        users = cons.get(p, ())
        if p in outs or len(users) != 1 or users[0].op != "matmul" or users[0].inputs[0] != p:
            continue
        pv = users[0]
        chain = [sm, pv]
        s = sm.inputs[0]
        bias = None
        n = prod.get(s)
        if n is not None and n.op == "add" and only_into(s, sm):
            a, b = n.inputs
            pa, pb = prod.get(a), prod.get(b)
            # The scores side is the operand that leads back to the q.k matmul.
            if pa is not None and pa.op in ("div", "mul", "matmul") and g.types[a] == g.types[s]:
                s, bias = a, b
            elif pb is not None and pb.op in ("div", "mul", "matmul") and g.types[b] == g.types[s]:
                s, bias = b, a
            else:
                continue
            chain.append(n)
            nxt = n
        else:
            nxt = sm
        scale = 1.0
        n = prod.get(s)
        if n is not None and n.op in ("div", "mul") and only_into(s, nxt):
            c = _scalar_param(g, n.inputs[1])
            if c is None or c == 0.0:
                continue
            scale = 1.0 / c if n.op == "div" else c
            chain.append(n)
            nxt = n
            s = n.inputs[0]
            n = prod.get(s)
        if n is None or n.op != "matmul" or not only_into(s, nxt):
            continue
        qk = n
        chain.append(qk)
        q, kt = qk.inputs
        v = pv.inputs[1]
        tq, tk, tv = g.types[q], g.types[kt], g.types[v]
        if tq.rank not in (3, 4) or tk.rank != tq.rank or tv.rank != tq.rank:
            continue
        if bias is not None and g.types[bias].dtype != tq.dtype:
            continue
        r = tq.rank
        swap = (*range(r - 2), r - 1, r - 2)
        new: list[Node] = []
        kt_node = prod.get(kt)
        base = pv.name
        if kt_node is not None and kt_node.op == "transpose":
            perm = attr_ints(kt_node.attrs, "perm")
            k_perm = tuple(perm[i] for i in swap)
            k_src = kt_node.inputs[0]
            if k_perm == tuple(range(r)):
                k = k_src
            else:
                k = f"{base}/keys"
                new.append(Node(f"{base}/keys_transpose", "transpose", (k_src,), (k,),
                                Attrs({"perm": k_perm})))
            if only_into(kt, qk):
                chain.append(kt_node)
        else:
            k = f"{base}/keys"
            new.append(Node(f"{base}/keys_transpose", "transpose", (kt,), (k,), Attrs({"perm": swap})))
        ins = (q, k, v) if bias is None else (q, k, v, bias)
        att = Node(f"{base}/attention", "attention", ins, pv.outputs,
                   Attrs({"mask": "none" if bias is None else "bias", "scale": float(scale), "window": None}))
        new.append(att)
        members = tuple(c.name for c in chain)
        if taken.intersection(members):
            continue
        taken.update(members)
        regions.append(Region(members, tuple(new), claim=(att.name,)))
    return regions


#: Attention written out as primitives, before legalization.
ATTENTION = FusionRule("attention", find_attention, stage="graph", provider="rlx_core",
                       doc="softmax(q k^T * scale [+ bias]) v becomes one attention node")


def fuse_attention(g: Graph, accept: Accept | None = None) -> tuple[Graph, list[list[str]]]:
    """``(graph, groups)``: the rewritten graph and, per new attention node, the node names it
    replaced (for the dispatch report). ``accept(graph, attention_node)`` decides per chain."""
    from . import regions

    def claims(n: Node, ins: object, outs: object) -> bool:
        return accept is None or accept(g, n)

    new, taken = regions.apply(g, [ATTENTION], "graph", claims)
    return new, regions.groups(taken, g)


__all__ = ["ATTENTION", "find_attention", "fuse_attention"]
