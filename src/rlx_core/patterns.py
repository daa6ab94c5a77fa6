"""Device-independent pattern fusion: attention, LayerNorm and RMSNorm written out as primitives.

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

Norms (:data:`LAYER_NORM`): exporters below ONNX opset 17 write LayerNorm as ReduceMean, Sub,
Pow, ReduceMean, Add, Sqrt, Div, Mul, Add, and LLaMA-family RMSNorm as Pow, ReduceMean, Add,
Sqrt, Div/Reciprocal, Mul, Mul: nine and seven kernels (and as many small-tensor dispatches)
where a backend claiming ``layer_norm`` / ``rms_norm`` runs one. Every intermediate must be read
inside the chain only; the affine weights must have the normalised trailing shape.
"""

from __future__ import annotations

import math
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


def _scaled(g: Graph, n: Node | None, only: bool) -> tuple[Node, str, float] | None:
    """``(node, x, c)`` where ``n`` is ``x * c`` / ``c * x`` / ``x / c`` with a nonzero scalar constant
    ``c`` (as a factor), read only where ``only`` says, of ``x``'s type."""
    if n is None or not only or n.op not in ("mul", "div") or len(n.inputs) != 2:
        return None
    pairs = [(n.inputs[0], n.inputs[1])] + ([(n.inputs[1], n.inputs[0])] if n.op == "mul" else [])
    for x, cn in pairs:
        c = _scalar_param(g, cn)
        if c is not None and c != 0.0 and math.isfinite(c) and x not in g.weights \
                and g.types[x] == g.types[n.outputs[0]]:
            return n, x, (1.0 / c if n.op == "div" else c)
    return None


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
        # Exporters that scale q and k^T each by sqrt(scale) (PyTorch's SDPA export) fold into the scale.
        kt_reader = qk
        for side in ("q", "k"):
            val = q if side == "q" else kt
            sc = _scaled(g, prod.get(val), only_into(val, qk))
            if sc is None:
                continue
            node, src, c = sc
            scale *= c
            chain.append(node)
            if side == "q":
                q = src
            else:
                kt, kt_reader = src, node
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
            if only_into(kt, kt_reader):
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


def _trailing_mean(g: Graph, n: Node | None) -> int | None:
    """The first normalised axis when ``n`` is a ``reduce_mean`` over x's trailing axes with
    ``keepdims`` (what a norm needs), else None."""
    if n is None or n.op != "reduce_mean" or not n.attrs.get("keepdims"):
        return None
    r = g.types[n.inputs[0]].rank
    given = tuple(range(r)) if n.attrs.get("axes") is None else attr_ints(n.attrs, "axes")  # None: all
    axes = sorted(a % r for a in given) if r else []
    if not axes or axes != list(range(axes[0], r)):
        return None
    return axes[0]


def _other(n: Node, v: str) -> str | None:
    """The operand of binary ``n`` that is not ``v`` (None when both are ``v``)."""
    a, b = n.inputs
    return b if a == v and b != v else a if b == v and a != v else None


def _square_of(g: Graph, n: Node | None, d: str) -> bool:
    """``n`` computes ``d * d`` or ``d ** 2``."""
    if n is None:
        return False
    if n.op == "mul":
        return n.inputs == (d, d)
    return n.op == "pow" and n.inputs[0] == d and _scalar_param(g, n.inputs[1]) == 2.0


def _only_into(g: Graph) -> Callable[[str, Node], bool]:
    """``only_into(v, n)``: value ``v`` is read by node ``n`` alone and is not a graph output."""
    cons = g.consumers
    outs = set(g.outputs)

    def only_into(v: str, n: Node) -> bool:
        return v not in outs and all(c.name == n.name for c in cons.get(v, ()))
    return only_into


def _affine(g: Graph, y: str, only_into: Callable[[str, Node], bool],
            want: tuple[object, ...], dtype: object) -> tuple[list[Node], str, str | None, str | None]:
    """After a normalised value ``y`` (made by ``start``): ``* gamma`` then ``+ beta`` when they
    follow, each of the normalised trailing shape. ``(nodes, out, gamma, beta)``."""
    cons = g.consumers
    chain: list[Node] = []
    gamma = beta = None
    users = cons.get(y, ())
    if len(users) == 1 and users[0].op == "mul" and only_into(y, users[0]):
        p = _other(users[0], y)
        if p is not None and g.types[p].shape == want and g.types[p].dtype == dtype:
            chain.append(users[0])
            gamma, y = p, users[0].outputs[0]
            users = cons.get(y, ())
            if len(users) == 1 and users[0].op == "add" and only_into(y, users[0]):
                p = _other(users[0], y)
                if p is not None and g.types[p].shape == want and g.types[p].dtype == dtype:
                    chain.append(users[0])
                    beta, y = p, users[0].outputs[0]
    return chain, y, gamma, beta


def find_layer_norm(g: Graph) -> list[Region]:
    """LayerNorm written out (what ONNX exporters emit below opset 17): ``d = x - mean(x)``,
    ``d / sqrt(mean(d * d) + eps) * gamma + beta`` over trailing axes, as one ``layer_norm``.
    Without the affine tail it is not matched (layer_norm needs gamma and beta)."""
    cons = g.consumers
    outs = set(g.outputs)
    only_into = _only_into(g)
    regions: list[Region] = []
    taken: set[str] = set()
    for mu in g.nodes:
        ax = _trailing_mean(g, mu)
        if ax is None:
            continue
        x = mu.inputs[0]
        tx = g.types[x]
        users = cons.get(mu.outputs[0], ())
        if (mu.outputs[0] in outs or len(users) != 1 or users[0].op != "sub"
                or users[0].inputs != (x, mu.outputs[0])):
            continue
        sub = users[0]
        d = sub.outputs[0]
        if d in outs or g.types[d] != tx:
            continue
        du = list({c.name: c for c in cons.get(d, ())}.values())  # a node once per operand use
        sq = next((c for c in du if _square_of(g, c, d)), None)
        div = next((c for c in du if c.op == "div" and c.inputs[0] == d), None)
        if sq is None or div is None or len(du) != 2:
            continue
        vu = cons.get(sq.outputs[0], ())
        if len(vu) != 1 or not only_into(sq.outputs[0], vu[0]) or _trailing_mean(g, vu[0]) != ax:
            continue
        var = vu[0]
        au = cons.get(var.outputs[0], ())
        if len(au) != 1 or au[0].op != "add" or not only_into(var.outputs[0], au[0]):
            continue
        add_eps = au[0]
        e = _other(add_eps, var.outputs[0])
        eps = None if e is None else _scalar_param(g, e)
        if eps is None or not np.isfinite(eps) or eps < 0:
            continue
        su = cons.get(add_eps.outputs[0], ())
        if len(su) != 1 or su[0].op != "sqrt" or not only_into(add_eps.outputs[0], su[0]):
            continue
        sqrt = su[0]
        if div.inputs[1] != sqrt.outputs[0] or not only_into(sqrt.outputs[0], div):
            continue
        want = tuple(tx.shape[ax:])
        tail, y, gamma, beta = _affine(g, div.outputs[0], only_into, want, tx.dtype)
        if gamma is None or beta is None or div.outputs[0] in outs:
            continue
        chain = [mu, sub, sq, var, add_eps, sqrt, div, *tail]
        members = tuple(c.name for c in chain)
        if taken.intersection(members):
            continue
        ln = Node(f"{tail[-1].name}/layer_norm", "layer_norm", (x, gamma, beta), (y,),
                  Attrs({"axis": ax, "eps": float(eps)}))
        taken.update(members)
        regions.append(Region(members, (ln,)))
    return regions


def _single_user(g: Graph, v: str, outs: set[str]) -> Node | None:
    users = list({c.name: c for c in g.consumers.get(v, ())}.values())
    return users[0] if len(users) == 1 and v not in outs else None


def find_rms_norm(g: Graph) -> list[Region]:
    """RMSNorm written out (LLaMA-family exports): ``ms = mean(x * x)`` over trailing axes, then
    ``x / sqrt(ms + eps)``, ``x * (1 / sqrt(ms + eps))``, ``x * reciprocal(sqrt(..))`` or
    ``x * rsqrt(ms + eps)``, then ``* gamma`` (either operand order), as one ``rms_norm``."""
    prod = g.producers
    outs = set(g.outputs)
    only_into = _only_into(g)
    regions: list[Region] = []
    taken: set[str] = set()
    for ms in g.nodes:
        ax = _trailing_mean(g, ms)
        if ax is None:
            continue
        sq = prod.get(ms.inputs[0])
        if sq is None or sq.op not in ("mul", "pow"):
            continue
        x = sq.inputs[0]
        if not _square_of(g, sq, x) or _single_user(g, sq.outputs[0], outs) is not ms:
            continue
        tx = g.types[x]
        add_eps = _single_user(g, ms.outputs[0], outs)
        if add_eps is None or add_eps.op != "add":
            continue
        e = _other(add_eps, ms.outputs[0])
        eps = None if e is None else _scalar_param(g, e)
        if eps is None or not np.isfinite(eps) or eps < 0:
            continue
        chain = [sq, ms, add_eps]
        nxt = _single_user(g, add_eps.outputs[0], outs)
        scaled: Node | None = None
        if nxt is not None and nxt.op == "rsqrt":
            chain.append(nxt)
            r = nxt.outputs[0]
        elif nxt is not None and nxt.op == "sqrt":
            chain.append(nxt)
            s_ = nxt.outputs[0]
            inv = _single_user(g, s_, outs)
            if inv is None:
                continue
            if inv.op == "div" and inv.inputs == (x, s_):
                scaled = inv
            elif ((inv.op == "div" and inv.inputs[1] == s_ and _scalar_param(g, inv.inputs[0]) == 1.0)
                  or inv.op == "reciprocal"):
                chain.append(inv)
            else:
                continue
            r = inv.outputs[0]
        else:
            continue
        if scaled is None:
            scaled = _single_user(g, r, outs)
            if scaled is None or scaled.op != "mul" or _other(scaled, r) != x:
                continue
        chain.append(scaled)
        if g.types[scaled.outputs[0]] != tx:
            continue
        want = tuple(tx.shape[ax:])
        tail, y, gamma, _ = _affine(g, scaled.outputs[0], only_into, want, tx.dtype)
        if gamma is None:
            continue
        chain.append(tail[0])  # the gamma multiply (a following add is not part of rms_norm)
        y = tail[0].outputs[0]
        members = tuple(c.name for c in chain)
        if taken.intersection(members):
            continue
        node = Node(f"{tail[0].name}/rms_norm", "rms_norm", (x, gamma), (y,),
                    Attrs({"axis": ax, "eps": float(eps)}))
        taken.update(members)
        regions.append(Region(members, (node,)))
    return regions


def find_norms(g: Graph) -> list[Region]:
    return [*find_layer_norm(g), *find_rms_norm(g)]


#: LayerNorm and RMSNorm written out as primitives, before legalization.
LAYER_NORM = FusionRule("norms", find_norms, stage="graph", provider="rlx_core",
                        doc="LayerNorm and RMSNorm written out become one layer_norm / rms_norm node")


def fuse_attention(g: Graph, accept: Accept | None = None) -> tuple[Graph, list[list[str]]]:
    """``(graph, groups)``: the rewritten graph and, per new attention node, the node names it
    replaced (for the dispatch report). ``accept(graph, attention_node)`` decides per chain."""
    from . import regions

    def claims(n: Node, ins: object, outs: object) -> bool:
        return accept is None or accept(g, n)

    new, taken = regions.apply(g, [ATTENTION], "graph", claims)
    return new, regions.groups(taken, g)


__all__ = ["ATTENTION", "LAYER_NORM", "find_attention", "find_layer_norm", "find_norms", "find_rms_norm",
           "fuse_attention"]
