"""The float64 reference of per-rank programs: every rank evaluated in one process, in lockstep.

Each rank's graph runs node by node with the ops' float64 references (as
:func:`rlx_core.ir.reference.evaluate`); at a group collective a rank waits until every rank of its
group has reached a collective, which must be the same op with the same attributes, and the op's
``simulate`` fact computes every rank's result at once. ``send`` deposits a message and goes on,
``recv`` waits for the matching one. Programs whose ranks disagree, or that deadlock, fail with an
error naming the ranks and nodes, which is what a real launch would hang on.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import reference_np_dtype
from ..errors import IRError
from ..ir.graph import Graph
from ..ir.reference import round_to, to_reference
from ..ir.schema import REGISTRY

Wait = tuple[str, Any]  # ("group", node) | ("recv", node)


def _rank_program(rank: int, graph: Graph, inputs: Mapping[str, Any], env: dict[str, np.ndarray],
                  round_intermediates: bool) -> Generator[Wait, list[np.ndarray] | None, None]:
    if graph.symbols:
        bindings: dict[str, int] = {}
        for v in graph.inputs:
            for d, n in zip(v.type.shape, np.shape(inputs[v.name])):
                if isinstance(d, str):
                    bindings.setdefault(d, int(n))
        graph = graph.specialize(bindings)
    for v in graph.inputs:
        env[v.name] = to_reference(inputs[v.name], v.type.dtype)
    for p in graph.params:
        env[p.name] = to_reference(graph.weights[p.name], p.type.dtype)
    for node in graph.nodes:
        schema = REGISTRY.get(node.op, where=node.where)
        outs: Sequence[Any] | None
        if schema.extra.get("collective"):
            outs = yield ("recv" if node.op == "recv" else "send" if node.op == "send" else "group", node)
            if node.op == "send":
                outs = [env[node.inputs[0]]]
            assert outs is not None
        else:
            outs = schema.reference([env[i] for i in node.inputs], node.attrs)
        for name, val in zip(node.outputs, outs):
            t = graph.types[name]
            val = np.asarray(val)
            env[name] = (round_to(val, t.dtype) if round_intermediates
                         else val.astype(reference_np_dtype(t.dtype)))
    env["__outputs__"] = np.asarray([0])  # marks completion
    env.update({f"__out__{o}": env[o] for o in graph.outputs})


def simulate(graphs: Sequence[Graph], inputs: Sequence[Mapping[str, Any]], *,
             round_intermediates: bool = True) -> list[dict[str, np.ndarray]]:
    """Run rank ``r``'s ``graphs[r]`` on ``inputs[r]`` for every rank together; returns each
    rank's outputs (float64, as :func:`~rlx_core.ir.reference.evaluate`)."""
    n = len(graphs)
    if len(inputs) != n:
        raise IRError(f"simulate: {n} programs but {len(inputs)} input sets",
                      fix="give one input dict per rank")
    envs: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
    gens = [_rank_program(r, g, i, e, round_intermediates)
            for r, (g, i, e) in enumerate(zip(graphs, inputs, envs))]
    waiting: list[Wait | None] = [None] * n
    done = [False] * n
    mail: dict[tuple[int, int, int], list[np.ndarray]] = {}

    def advance(r: int, value: list[np.ndarray] | None) -> None:
        try:
            waiting[r] = gens[r].send(value) if value is not None or waiting[r] is not None else next(gens[r])
        except StopIteration:
            waiting[r], done[r] = None, True

    for r in range(n):
        advance(r, None)
    while not all(done):
        progressed = False
        for r in range(n):
            w = waiting[r]
            if w is None:
                continue
            kind, node = w
            if kind == "send":
                peer, tag = int(node.attrs["peer"]), int(node.attrs["tag"])
                mail.setdefault((r, peer, tag), []).append(envs[r][node.inputs[0]].copy())
                advance(r, [])
                progressed = True
            elif kind == "recv":
                box = mail.get((int(node.attrs["peer"]), r, int(node.attrs["tag"])))
                if box:
                    advance(r, [box.pop(0)])
                    progressed = True
        # group collectives: complete a group whose members all wait at a collective
        for r in range(n):
            w = waiting[r]
            if w is None or w[0] != "group":
                continue
            node = w[1]
            group = tuple(node.attrs["group"]) or tuple(range(n))
            ws = [waiting[m] for m in group]
            if any(x is None or x[0] != "group" for x in ws):
                continue
            nodes = [x[1] for x in ws if x is not None]
            first = nodes[0]
            for m, other in zip(group, nodes):
                if other.op != first.op or dict(other.attrs) != dict(first.attrs):
                    raise IRError(f"ranks {group[0]} and {m} disagree at a collective: {first.op} "
                                  f"{dict(first.attrs)} (node {first.name!r}) vs {other.op} "
                                  f"{dict(other.attrs)} (node {other.name!r})",
                                  fix="every rank of a group must run the same collectives in the same order")
            sim = REGISTRY.get(first.op).extra["simulate"]
            per_rank = [[envs[m][i] for i in nd.inputs] for m, nd in zip(group, nodes)]
            outs = sim(per_rank, first.attrs)
            for m, o in zip(group, outs):
                advance(m, [np.asarray(v) for v in o])
            progressed = True
            break
        if not progressed and not all(done):
            stuck = ", ".join(f"rank {r} at {w[1].op} ({w[1].name!r})" for r, w in enumerate(waiting) if w)
            raise IRError(f"the per-rank programs deadlock: {stuck}",
                          fix="match every recv with a send and run each group's collectives on all "
                              "of its ranks")
    return [{o: e[f"__out__{o}"] for o in g.outputs} for g, e in zip(graphs, envs)]


__all__ = ["simulate"]
