"""Autodiff as graph transformations: every transform takes a :class:`Graph` and returns a new one.

* :func:`grad` / :func:`value_and_grad` / :func:`vjp` — reverse mode;
* :func:`jvp` — forward mode; :func:`hvp` — forward-over-reverse Hessian-vector products;
* :func:`vmap` (in :mod:`.batching`) — batching over a new leading axis;
* :func:`params_as_inputs` — turn parameters into graph inputs so a runtime can feed new values.

The input graph is replayed into a fresh builder under its own names, then the derivative nodes are
appended and dead nodes pruned. Nodes keep their op (HIR included) when the op has a rule for the
mode at hand; an HIR (or plugin) op without one is replaced by its MIR decomposition on the
differentiated path, so every op with a decomposition is differentiable. Forward mode can also
use an op's reverse rule by transposing it (the rule is linear in its cotangents), so a plugin op
that registers only ``register_vjp`` gets ``jvp``/``hvp`` too.

Naming: derivatives are outputs ``grad_<wrt>``, ``tangent_<output>``, ``hvp_<wrt>``; new inputs are
``cotangent_<output>`` and ``tangent_<wrt>`` (with ``_1``, ``_2``... appended on a name clash).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import IRError
from ..ir.builder import Tensor
from ..ir.graph import Graph, Node
from ..ir.schema import REGISTRY
from ..ir.types import TensorType
from ._util import ADBuilder, decomposition_graph, full, unique_name, zeros_like
from .registry import get_jvp, get_vjp

ShouldInline = Callable[[str], bool]


# -- small graph utilities -----------------------------------------------------------------------

def params_as_inputs(graph: Graph, names: Iterable[str]) -> Graph:
    """The same graph with the named parameters turned into inputs (appended after the existing
    inputs, in the order given). Their initial values stay available as ``graph.weights[name]``."""
    names = list(dict.fromkeys(names))
    params = {p.name: p for p in graph.params}
    missing = [n for n in names if n not in params]
    if missing:
        raise IRError(f"{missing} are not parameters of graph {graph.name!r}",
                      fix=f"parameters: {', '.join(params) or 'none'}")
    moved = set(names)
    keep = tuple(p for p in graph.params if p.name not in moved)
    return Graph(graph.name, graph.inputs + tuple(params[n] for n in names), keep, graph.nodes,
                 graph.outputs, {p.name: graph.weights[p.name] for p in keep})


def prune(graph: Graph, keep_params: Iterable[str] = ()) -> Graph:
    """Drop nodes no output depends on, and parameters nothing uses (except ``keep_params``)."""
    keep = set(keep_params)
    live = set(graph.outputs)
    nodes: list[Node] = []
    for n in reversed(graph.nodes):
        if any(o in live for o in n.outputs):
            nodes.append(n)
            live.update(n.inputs)
    nodes.reverse()
    params = tuple(p for p in graph.params if p.name in live or p.name in keep)
    return Graph(graph.name, graph.inputs, params, tuple(nodes), graph.outputs,
                 {p.name: graph.weights[p.name] for p in params})


def depends(nodes: Sequence[Node], types: Mapping[str, TensorType], sources: Iterable[str]) -> set[str]:
    """The float values that depend on ``sources`` (the sources included)."""
    active = set(sources)
    for n in nodes:
        if any(i in active for i in n.inputs):
            active.update(o for o in n.outputs if types[o].dtype.is_float)
    return active


def _has_decomposition(op: str) -> bool:
    return op in REGISTRY and REGISTRY.get(op).decompose is not None


def inline(b: ADBuilder, op: str, ins: Sequence[Tensor], attrs: Any, should_inline: ShouldInline
           ) -> list[Tensor]:
    """Emit ``op``'s decomposition into ``b`` (recursively for the ops ``should_inline`` names)."""
    sub = decomposition_graph(REGISTRY.get(op), [t.type for t in ins], attrs)
    env: dict[str, Tensor] = {v.name: t for v, t in zip(sub.inputs, ins)}
    for p in sub.params:
        env[p.name] = b.const(np.asarray(sub.weights[p.name]), p.type.dtype)
    for n in sub.nodes:
        sins = [env[i] for i in n.inputs]
        if should_inline(n.op):
            outs = inline(b, n.op, sins, n.attrs, should_inline)
        else:
            outs = b.emit(n.op, sins, n.attrs)
        env.update(zip(n.outputs, outs))
    return [env[o] for o in sub.outputs]


def _needs_vjp_inline(op: str) -> bool:
    return get_vjp(op) is None and _has_decomposition(op)


def _needs_jvp_inline(op: str) -> bool:
    return get_jvp(op) is None and _has_decomposition(op)


def _needs_any_inline(op: str) -> bool:
    return (get_vjp(op) is None or get_jvp(op) is None) and _has_decomposition(op)


_INLINE: dict[str, ShouldInline] = {"vjp": _needs_vjp_inline, "jvp": _needs_jvp_inline,
                                    "both": _needs_any_inline}


# -- the reverse and forward passes --------------------------------------------------------------

def _check_rule_result(kind: str, node: Node, res: Sequence[Any], like: Sequence[Tensor]) -> list:
    res = list(res)
    if len(res) != len(like):
        raise IRError(f"the {kind} rule of op {node.op!r} returned {len(res)} values for {len(like)} "
                      f"{'inputs' if kind == 'vjp' else 'outputs'}", where=node.where,
                      fix=f"a {kind} rule returns one tensor (or None) per "
                          f"{'input' if kind == 'vjp' else 'output'}")
    for i, (r, t) in enumerate(zip(res, like)):
        if r is not None and (not isinstance(r, Tensor) or r.type != t.type):
            got = r.type if isinstance(r, Tensor) else type(r).__name__
            raise IRError(f"the {kind} rule of op {node.op!r} returned {got} for "
                          f"{'input' if kind == 'vjp' else 'output'} {i} of type {t.type}",
                          where=node.where, fix="return a tensor with exactly that shape and dtype "
                                                "(sum or expand it), or None for no derivative")
    return res


def _accumulate(b: ADBuilder, table: dict[str, Tensor], name: str, t: Tensor) -> None:
    table[name] = table[name] + t if name in table else t


def vjp_node(b: ADBuilder, node: Node, cts: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Input cotangents of one node: its rule, else backprop through its decomposition."""
    ins = [b.tensor(i) for i in node.inputs]
    outs = [b.tensor(o) for o in node.outputs]
    rule = get_vjp(node.op)
    if rule is not None:
        return _check_rule_result("vjp", node, rule(b, ins, outs, cts, node.attrs), ins)
    if _has_decomposition(node.op):
        start = len(b.nodes)
        douts = inline(b, node.op, ins, node.attrs, _needs_vjp_inline)
        sub = list(b.nodes[start:])
        seeds: dict[str, Tensor] = {}
        for d, c in zip(douts, cts):
            if c is not None:
                _accumulate(b, seeds, d.name, c)
        srcs = [t.name for t in ins if t.dtype.is_float]
        got = backprop(b, sub, seeds, depends(sub, b._types, srcs))
        seen: set[str] = set()
        res: list[Tensor | None] = []
        for t in ins:  # an operand used twice gets its total once
            res.append(got.get(t.name) if t.name not in seen else None)
            seen.add(t.name)
        return res
    raise IRError(f"op {node.op!r} has no vjp rule and no decomposition, so it cannot be "
                  f"differentiated", where=node.where,
                  fix=f"register one: rlx_core.autodiff.register_vjp({node.op!r}, rule)")


def backprop(b: ADBuilder, nodes: Sequence[Node], seeds: Mapping[str, Tensor], active: set[str]
             ) -> dict[str, Tensor]:
    """Reverse accumulation over ``nodes`` (in forward order) from ``seeds`` (value -> cotangent);
    cotangents flow only into ``active`` values. Returns every cotangent computed."""
    ct: dict[str, Tensor] = dict(seeds)
    for node in reversed(list(nodes)):
        cts = [ct.get(o) for o in node.outputs]
        if all(c is None for c in cts) or not any(i in active for i in node.inputs):
            continue
        for name, r in zip(node.inputs, vjp_node(b, node, cts)):
            if r is not None and name in active:
                _accumulate(b, ct, name, r)
    return ct


def _transposed_vjp(b: ADBuilder, node: Node, ins: list[Tensor], outs: list[Tensor],
                    tins: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Forward mode from a reverse rule: the rule is linear in its cotangents ``u``, so
    backpropagating the input tangents through ``u -> vjp(u)`` gives ``J @ t``."""
    us = [b.op("expand", b.const(0, o.dtype), shape=o.shape) if o.dtype.is_float else None for o in outs]
    start = len(b.nodes)
    rule = get_vjp(node.op)
    assert rule is not None  # jvp_node calls this only for ops with a vjp rule
    res = _check_rule_result("vjp", node, rule(b, ins, outs, us, node.attrs), ins)
    sub = list(b.nodes[start:])
    seeds: dict[str, Tensor] = {}
    for r, t in zip(res, tins):
        if r is not None and t is not None:
            _accumulate(b, seeds, r.name, t)
    srcs = [u.name for u in us if u is not None]
    got = backprop(b, sub, seeds, depends(sub, b._types, srcs))
    return [None if u is None else got.get(u.name) for u in us]


def jvp_node(b: ADBuilder, node: Node, tins: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Output tangents of one node: its rule, else its decomposition, else its transposed vjp."""
    ins = [b.tensor(i) for i in node.inputs]
    outs = [b.tensor(o) for o in node.outputs]
    rule = get_jvp(node.op)
    if rule is not None:
        return _check_rule_result("jvp", node, rule(b, ins, outs, tins, node.attrs), outs)
    if _has_decomposition(node.op):
        start = len(b.nodes)
        douts = inline(b, node.op, ins, node.attrs, _needs_jvp_inline)
        tan = {t.name: tt for t, tt in zip(ins, tins) if tt is not None}
        forward(b, list(b.nodes[start:]), tan)
        return [tan.get(d.name) for d in douts]
    if get_vjp(node.op) is not None:
        return _transposed_vjp(b, node, ins, outs, tins)
    raise IRError(f"op {node.op!r} has no jvp rule, no decomposition and no vjp rule, so it cannot "
                  f"be differentiated in forward mode", where=node.where,
                  fix=f"register one: rlx_core.autodiff.register_jvp({node.op!r}, rule)")


def forward(b: ADBuilder, nodes: Sequence[Node], tan: dict[str, Tensor]) -> dict[str, Tensor]:
    """Push tangents (value -> tangent, updated in place) through ``nodes`` in order. Seeded values
    keep their seed even when a node produces them."""
    seeded = set(tan)
    for node in nodes:
        tins = [tan.get(i) for i in node.inputs]
        if all(t is None for t in tins):
            continue
        for o, t in zip(node.outputs, jvp_node(b, node, tins)):
            if t is not None and o not in seeded:
                tan[o] = t
    return tan


# -- Trace: a graph replayed into a builder ------------------------------------------------------

class Trace:
    """``graph`` replayed into an :class:`ADBuilder` (``self.b``), ``env`` mapping every original
    value name to its tensor. Derivative passes append to the same builder; :meth:`finish` builds
    the result. Nodes on the path from ``differentiate`` that lack a rule for ``mode`` ("vjp",
    "jvp" or "both") are replaced by their decomposition."""

    def __init__(self, graph: Graph, *, differentiate: Sequence[str] = (), mode: str | None = None,
                 name: str | None = None) -> None:
        self.graph = graph
        reserved = set(graph.types) | {n.name for n in graph.nodes}
        self.b = b = ADBuilder(name or graph.name, reserved)
        self.env: dict[str, Tensor] = {}
        env = self.env
        active = depends(graph.nodes, graph.types, differentiate)
        should = _INLINE[mode] if mode else None
        for v in graph.inputs:
            env[v.name] = b.input(v.name, v.type.dtype, v.type.shape)
        for p in graph.params:
            env[p.name] = b.param(p.name, graph.weights[p.name], p.type.dtype)
        self.original_params = [p.name for p in graph.params]
        for node in graph.nodes:
            ins = [env[i] for i in node.inputs]
            if should is not None and should(node.op) and any(o in active for o in node.outputs):
                outs = inline(b, node.op, ins, node.attrs, should)
            else:
                outs = b.add_node(Node(node.name, node.op, tuple(t.name for t in ins), node.outputs,
                                       node.attrs))
            env.update(zip(node.outputs, outs))

    def unique(self, want: str) -> str:
        name = unique_name(want, _Taken(self.b))
        self.b.reserve([name])
        return name

    def input(self, want: str, like: TensorType) -> Tensor:
        return self.b.input(self.unique(want), like.dtype, like.shape)

    def gradients(self, seeds: Mapping[str, Tensor], wrt: Sequence[str]) -> dict[str, Tensor | None]:
        """d(sum of seeds . values)/d wrt, by reverse accumulation over the replayed nodes."""
        fwd = list(self.b.nodes)
        start: dict[str, Tensor] = {}
        for name, t in seeds.items():
            _accumulate(self.b, start, self.env[name].name, t)
        active = depends(fwd, self.b._types, [self.env[w].name for w in wrt])
        ct = backprop(self.b, fwd, start, active)
        return {w: ct.get(self.env[w].name) for w in wrt}

    def tangents(self, seeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Tangents of every value (keyed by builder value name) given tangents of ``seeds``."""
        tan = {self.env[k].name: v for k, v in seeds.items()}
        return forward(self.b, list(self.b.nodes), tan)

    def finish(self, outputs: Sequence[tuple[Tensor, str]]) -> Graph:
        for t, name in outputs:
            self.b.output(t, name)
        return prune(self.b.build(), keep_params=self.original_params)


class _Taken:
    def __init__(self, b: ADBuilder) -> None:
        self.b = b

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (self.b.has(name) or name in self.b._reserved)


# -- public transforms ---------------------------------------------------------------------------

def _names(x: str | Sequence[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def _check_values(graph: Graph, names: Sequence[str], what: str, need_float: bool = True) -> None:
    if len(set(names)) != len(names):
        raise IRError(f"{what} lists a value twice: {list(names)}", fix="list each value once")
    for n in names:
        if n not in graph.types:
            raise IRError(f"{what}: {n!r} is not a value of graph {graph.name!r}",
                          fix=f"inputs: {[v.name for v in graph.inputs]}, "
                              f"params: {[p.name for p in graph.params]}")
        if need_float and not graph.types[n].dtype.is_float:
            raise IRError(f"{what}: {n!r} is {graph.types[n]}; only floating values are differentiable",
                          fix="differentiate with respect to float inputs or parameters")


def _prepare(graph: Graph, wrt: Sequence[str], params_to_inputs: bool) -> Graph:
    if params_to_inputs:
        params = {p.name for p in graph.params}
        graph = params_as_inputs(graph, [w for w in wrt if w in params])
    return graph


def _check_scalar(graph: Graph, loss: str) -> None:
    t = graph.types[loss]
    if any(d != 1 for d in t.shape):
        raise IRError(f"loss {loss!r} has type {t}; grad needs a single element",
                      fix="reduce it first (reduce_sum / reduce_mean), or use vjp with a cotangent input")


def _reverse(graph: Graph, loss: str, wrt: str | Sequence[str], params_to_inputs: bool, keep_all: bool,
             name: str | None) -> Graph:
    wrt = _names(wrt)
    _check_values(graph, [loss], "loss")
    _check_values(graph, wrt, "wrt")
    _check_scalar(graph, loss)
    graph = _prepare(graph, wrt, params_to_inputs)
    tr = Trace(graph, differentiate=wrt, mode="vjp", name=name or f"{graph.name}_grad")
    value = tr.env[loss]
    grads = tr.gradients({loss: full(tr.b, 1.0, value.shape, value.dtype)}, wrt)
    outs = [(tr.env[o], o) for o in graph.outputs] if keep_all else [(value, loss)]
    for w in wrt:
        g = grads[w]
        outs.append((g if g is not None else zeros_like(tr.b, tr.env[w]), tr.unique(f"grad_{w}")))
    return tr.finish(outs)


def grad(graph: Graph, loss: str, wrt: str | Sequence[str], *, params_to_inputs: bool = False,
         name: str | None = None) -> Graph:
    """A graph with the same inputs and parameters whose outputs are ``loss`` then ``grad_<w>`` =
    d loss / d w for each ``w`` in ``wrt`` (inputs, parameters or intermediate values; a value
    the loss does not depend on gets a zero gradient). ``loss`` must have one element.

    With ``params_to_inputs=True`` the parameters named in ``wrt`` become inputs (see
    :func:`params_as_inputs`), so a runtime can feed updated values."""
    return _reverse(graph, loss, wrt, params_to_inputs, False, name)


def value_and_grad(graph: Graph, loss: str, wrt: str | Sequence[str], *, params_to_inputs: bool = False,
                   name: str | None = None) -> Graph:
    """Like :func:`grad` but keeps every original output (the loss and any auxiliary outputs, in
    their order) before the gradients."""
    return _reverse(graph, loss, wrt, params_to_inputs, True, name)


def vjp(graph: Graph, outputs: str | Sequence[str], wrt: str | Sequence[str], *,
        params_to_inputs: bool = False, name: str | None = None) -> Graph:
    """Vector-Jacobian products: new inputs ``cotangent_<o>`` (one per output ``o``, its type);
    outputs are the listed ``outputs`` then ``grad_<w>`` = sum_o cotangent_o . d o / d w."""
    outputs, wrt = _names(outputs), _names(wrt)
    _check_values(graph, outputs, "outputs")
    _check_values(graph, wrt, "wrt")
    graph = _prepare(graph, wrt, params_to_inputs)
    tr = Trace(graph, differentiate=wrt, mode="vjp", name=name or f"{graph.name}_vjp")
    seeds = {o: tr.input(f"cotangent_{o}", graph.types[o]) for o in outputs}
    grads = tr.gradients(seeds, wrt)
    outs = [(tr.env[o], o) for o in outputs]
    for w in wrt:
        g = grads[w]
        outs.append((g if g is not None else zeros_like(tr.b, tr.env[w]), tr.unique(f"grad_{w}")))
    return tr.finish(outs)


def jvp(graph: Graph, wrt: str | Sequence[str], *, outputs: Sequence[str] | None = None,
        params_to_inputs: bool = False, name: str | None = None) -> Graph:
    """Jacobian-vector products (forward mode): new inputs ``tangent_<w>`` (one per ``w``, its type);
    outputs are the primal ``outputs`` (default: the graph's) then ``tangent_<o>`` for each floating
    output ``o`` (zero where ``o`` does not depend on ``wrt``)."""
    wrt = _names(wrt)
    _check_values(graph, wrt, "wrt")
    outputs = list(graph.outputs) if outputs is None else _names(outputs)
    _check_values(graph, outputs, "outputs", need_float=False)
    graph = _prepare(graph, wrt, params_to_inputs)
    tr = Trace(graph, differentiate=wrt, mode="jvp", name=name or f"{graph.name}_jvp")
    seeds = {w: tr.input(f"tangent_{w}", graph.types[w]) for w in wrt}
    tan = tr.tangents(seeds)
    outs = [(tr.env[o], o) for o in outputs]
    for o in outputs:
        if graph.types[o].dtype.is_float:
            t = tan.get(tr.env[o].name)
            outs.append((t if t is not None else zeros_like(tr.b, tr.env[o]), tr.unique(f"tangent_{o}")))
    return tr.finish(outs)


def hvp(graph: Graph, loss: str, wrt: str | Sequence[str], *, params_to_inputs: bool = False,
        name: str | None = None) -> Graph:
    """Hessian-vector products by forward-over-reverse: new inputs ``tangent_<w>``; outputs are
    ``loss``, ``grad_<w>`` for each ``w``, then ``hvp_<w>`` = sum_v d^2 loss / (dw dv) tangent_v."""
    wrt = _names(wrt)
    _check_values(graph, [loss], "loss")
    _check_values(graph, wrt, "wrt")
    _check_scalar(graph, loss)
    graph = _prepare(graph, wrt, params_to_inputs)
    tr = Trace(graph, differentiate=wrt, mode="both", name=name or f"{graph.name}_hvp")
    value = tr.env[loss]
    grads = tr.gradients({loss: full(tr.b, 1.0, value.shape, value.dtype)}, wrt)
    gts = {w: gw if (gw := grads[w]) is not None else zeros_like(tr.b, tr.env[w]) for w in wrt}
    seeds = {w: tr.input(f"tangent_{w}", graph.types[w]) for w in wrt}
    tan = tr.tangents(seeds)
    outs = [(value, loss)]
    outs += [(gts[w], tr.unique(f"grad_{w}")) for w in wrt]
    for w in wrt:
        t = tan.get(gts[w].name)
        outs.append((t if t is not None else zeros_like(tr.b, tr.env[w]), tr.unique(f"hvp_{w}")))
    return tr.finish(outs)


__all__ = ["Trace", "backprop", "depends", "forward", "grad", "hvp", "inline", "jvp", "jvp_node",
           "params_as_inputs", "prune", "value_and_grad", "vjp", "vjp_node"]
