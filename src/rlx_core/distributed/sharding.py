"""Sharding passes: a graph plus a mesh becomes per-rank programs.

**Annotations.** A value is :class:`Replicated` (every rank holds all of it) or :class:`Split`
along an axis (rank r holds part r of n). A plan annotates parameters (``{param: Split(axis)}``);
:func:`megatron_plan` writes the Megatron-LM plan for transformer graphs: the q/k/v projections and
the first FFN linear are column-parallel (weights split on their output axis, so attention heads
and FFN units are divided among the ranks), and the linears after them become row-parallel by
propagation.

**Tensor parallel** (:func:`tensor_parallel`): layouts propagate node by node from the annotated
parameters. ``linear`` with a replicated input and a weight split on axis 0 gives an output split on
its last axis (column-parallel); ``linear`` whose input is split on its last axis (and whose
weight is not annotated) slices its weight on axis 1, keeps the bias on one rank, and ends with an
``all_reduce(sum)`` (row-parallel: the only communication of a Megatron layer pair). ``reshape``,
``transpose``, ``attention`` (split on heads) and elementwise activations keep a split; any other
op with a split operand first ``all_gather``s it, so the per-rank program is always correct, just
slower where the plan does not fit.

**Pipeline parallel** (:func:`pipeline_stages`): the graph is cut at given values into stages, one
per rank; a stage ends by ``send``ing the values the next stages need and begins by ``recv``ing
them. :class:`PipelineRunner` runs micro-batches through the stages (GPipe's forward schedule: stage
s works on micro-batch i while stage s+1 works on micro-batch i-1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IRError, ShapeError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from ..ir.schema import REGISTRY


@dataclass(frozen=True)
class Replicated:
    """Every rank holds the whole value."""


@dataclass(frozen=True)
class Split:
    """Rank r holds part r of ``world`` equal parts along ``axis``."""

    axis: int


Layout = Replicated | Split
R = Replicated()

#: Ops that apply elementwise to one operand, so a split passes through.
_UNARY_KEEP = frozenset({"gelu", "relu", "silu", "tanh", "sigmoid", "exp", "neg", "abs", "erf", "cast"})
_THROUGH = frozenset({"reshape", "transpose"})


def _consumers(graph: Graph) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            out.setdefault(i, []).append(n)
    return out


def megatron_plan(graph: Graph) -> dict[str, Split]:
    """Column-parallel annotations for every ``linear`` whose output reaches an ``attention`` (through
    reshapes and transposes) or an activation: its weight ``Split(0)`` and bias ``Split(0)``."""
    cons = _consumers(graph)
    plan: dict[str, Split] = {}
    for n in graph.nodes:
        if n.op != "linear":
            continue
        v, hit = n.outputs[0], False
        for _ in range(4):
            users = cons.get(v, [])
            if len(users) != 1:
                break
            u = users[0]
            if u.op == "attention" or u.op in _UNARY_KEEP - {"cast"}:
                hit = True
                break
            if u.op not in _THROUGH:
                break
            v = u.outputs[0]
        if hit:
            plan[n.inputs[1]] = Split(0)
            if len(n.inputs) > 2:
                plan[n.inputs[2]] = Split(0)
    return plan


def _static(d: Any) -> int | None:
    return d if isinstance(d, int) else None


def _part(arr: np.ndarray, axis: int, rank: int, world: int, what: str) -> np.ndarray:
    n = arr.shape[axis]
    if n % world:
        raise ShapeError(f"{what}: axis {axis} of size {n} does not split over {world} ranks",
                         fix=f"use a world size dividing {n}, or leave {what} replicated")
    k = n // world
    return np.ascontiguousarray(np.take(arr, range(rank * k, (rank + 1) * k), axis=axis))


def tensor_parallel(graph: Graph, world: int, rank: int, plan: Mapping[str, Layout] | None = None, *,
                    group: Sequence[int] = ()) -> Graph:
    """Rank ``rank``'s program of ``graph`` split over ``world`` ranks (see the module docstring).
    ``plan`` annotates parameters (default :func:`megatron_plan`); ``group`` is the tensor-parallel
    group's global ranks (default: every rank)."""
    if not 0 <= rank < world:
        raise IRError(f"tensor_parallel: rank {rank} is not in 0..{world - 1}", fix="pass this rank's index")
    plan = dict(megatron_plan(graph) if plan is None else plan)
    grp = tuple(group)
    b = GraphBuilder(f"{graph.name}_tp{world}_r{rank}")
    env: dict[str, tuple[Tensor, Layout]] = {}
    for v in graph.inputs:
        env[v.name] = (b.input(v.name, v.type.dtype, v.type.shape), R)
    weights = graph.weights
    params = {p.name for p in graph.params}

    def param(name: str, layout: Layout, axis_override: int | None = None) -> Tensor:
        arr = np.asarray(weights[name])
        if isinstance(layout, Split):
            ax = layout.axis if axis_override is None else axis_override
            arr = _part(arr, ax % arr.ndim, rank, world, f"parameter {name!r}")
        return b.param(name, arr)

    def value(name: str) -> tuple[Tensor, Layout]:
        if name not in env:
            if name in params:
                lay = plan.get(name, R)
                env[name] = (param(name, lay), lay)
            else:
                raise IRError(f"tensor_parallel: value {name!r} is used before it is defined")
        return env[name]

    def gather(name: str) -> Tensor:
        t, lay = value(name)
        if isinstance(lay, Split):
            if name in params:  # a split parameter also used replicated: take it whole there
                return b.param(b.fresh(f"{name}.full"), np.asarray(weights[name]))
            return b.op("all_gather", t, world=world, axis=lay.axis, group=grp)
        return t

    def layout(name: str) -> Layout:
        return env[name][1] if name in env else plan.get(name, R) if name in params else R

    for n in graph.nodes:
        lays = [layout(i) for i in n.inputs]
        attrs: dict[str, Any] = dict(n.attrs)
        out: Any = None
        out_lay: Layout = R
        rank_in = len(graph.types[n.inputs[0]].shape) if n.inputs else 0
        if (n.op == "linear" and isinstance(lays[0], Split) and lays[0].axis % rank_in == rank_in - 1
                and all(i in params and i not in plan and i not in env for i in n.inputs[1:])):
            # row-parallel: this rank's slice of the input features; the bias is added once
            x = value(n.inputs[0])[0]
            w = param(n.inputs[1], Split(1))
            bias = np.asarray(weights[n.inputs[2]]) if len(n.inputs) > 2 else None
            if bias is not None:
                part = b.param(n.inputs[2], bias if rank == 0 else np.zeros_like(bias))
                y = b.op("linear", x, w, part)
            else:
                y = b.op("linear", x, w)
            out = b.op("all_reduce", y, world=world, reduction="sum", group=grp)
            for name in n.outputs:
                env[name] = (out, R)
            continue
        ins = [value(i) for i in n.inputs]
        if n.op == "linear" and all(isinstance(x, Replicated) for x in lays):
            out = b.op("linear", *[t for t, _ in ins])
        elif (n.op == "linear" and isinstance(lays[0], Replicated) and isinstance(lays[1], Split)
              and lays[1].axis == 0 and (len(lays) < 3 or lays[2] == Split(0))):
            out, out_lay = b.op("linear", *[t for t, _ in ins]), Split(-1)  # column-parallel
        elif n.op in _THROUGH and isinstance(lays[0], Split):
            out, out_lay = _through(b, n, ins[0][0], lays[0], world, graph, attrs)
            if out is None:
                out = b.op(n.op, gather(n.inputs[0]), **attrs)
                out_lay = R
        elif n.op == "attention" and all(lay == Split(1) for lay in lays[:3]) and \
                all(isinstance(x, Replicated) for x in lays[3:]):
            out, out_lay = b.op("attention", *[t for t, _ in ins], **attrs), Split(1)
        elif n.op in _UNARY_KEEP and len(ins) == 1 and isinstance(lays[0], Split):
            out, out_lay = b.op(n.op, ins[0][0], **attrs), lays[0]
        else:
            out = b.op(n.op, *[gather(i) for i in n.inputs], **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        for name, t in zip(n.outputs, outs):
            env[name] = (t, out_lay)
    for o in graph.outputs:
        t, lay = env[o]
        if isinstance(lay, Split):
            t = b.op("all_gather", t, world=world, axis=lay.axis, group=grp)
        b.output(t, o)
    return b.build()


def _through(b: GraphBuilder, n: Any, x: Tensor, lay: Split, world: int, graph: Graph,
             attrs: dict[str, Any]) -> tuple[Any, Layout]:
    full_in = graph.types[n.inputs[0]].shape
    ax = lay.axis % len(full_in)
    if n.op == "transpose":
        perm = attrs["perm"] if attrs["perm"] is not None else tuple(reversed(range(len(full_in))))
        perm = tuple(p % len(full_in) for p in perm)
        return b.op("transpose", x, **attrs), Split(perm.index(ax))
    target = tuple(attrs["shape"])
    tail = full_in[ax:]
    if any(_static(d) is None for d in tail):
        return None, R
    for k in range(len(target) + 1):
        if tuple(target[:k]) != tuple(full_in[:ax]) or k == len(target):
            continue
        rest = target[k:]
        if any(_static(d) is None for d in rest) or math.prod(rest) != math.prod(tail):
            continue
        # the split axis of the input is the leading one of its tail: it must stay leading
        # (rank r holds elements [r*N/n, (r+1)*N/n) of every leading index's block of N)
        lead = int(rest[0])
        if lead % world:
            continue
        local = list(target)
        local[k] = lead // world
        return b.op("reshape", x, shape=tuple(local)), Split(k)
    return None, R


# -- pipeline parallel -------------------------------------------------------------------------------

def pipeline_stages(graph: Graph, cuts: Sequence[str], *, ranks: Sequence[int] | None = None,
                    tag: int = 100) -> list[Graph]:
    """``graph`` cut after the nodes producing ``cuts`` (one value per boundary, in order): stage s
    (run by ``ranks[s]``, default rank s) computes its nodes, ``send``s every value a later stage
    reads to the next stage, which ``recv``s it. Values needed further on are forwarded stage by stage;
    graph inputs are fed to every stage that reads them; the last stage holds the graph's outputs."""
    order = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    bounds = []
    for c in cuts:
        if c not in order:
            raise IRError(f"pipeline_stages: cut value {c!r} is not produced by a node",
                          fix="cut at an intermediate value (a node output)")
        bounds.append(order[c] + 1)
    if bounds != sorted(bounds):
        raise IRError("pipeline_stages: cuts must follow the graph order", fix="list cut values in order")
    starts = [0, *bounds]
    ends = [*bounds, len(graph.nodes)]
    nstages = len(starts)
    ranks = list(range(nstages)) if ranks is None else list(ranks)
    stage_of: dict[str, int] = {}
    for s, (a, e) in enumerate(zip(starts, ends)):
        for n in graph.nodes[a:e]:
            for o in n.outputs:
                stage_of[o] = s
    params = {p.name for p in graph.params}
    # the values each stage needs from earlier stages (and so must be carried across each boundary)
    needs: list[set[str]] = [set() for _ in range(nstages)]
    for s, (a, e) in enumerate(zip(starts, ends)):
        for n in graph.nodes[a:e]:
            needs[s].update(i for i in n.inputs if i in stage_of and stage_of[i] < s)
    needs[-1].update(o for o in graph.outputs if o in stage_of and stage_of[o] < nstages - 1)
    carry: list[list[str]] = []  # carry[s]: values sent from stage s to s+1
    for s in range(nstages - 1):
        carry.append(sorted({v for t in range(s + 1, nstages) for v in needs[t] if stage_of[v] <= s},
                            key=lambda v: order[v]))
    out: list[Graph] = []
    for s, (a, e) in enumerate(zip(starts, ends)):
        b = GraphBuilder(f"{graph.name}_stage{s}")
        env: dict[str, Tensor] = {}
        used = {i for n in graph.nodes[a:e] for i in n.inputs}
        used |= set(graph.outputs) if s == nstages - 1 else set()
        used |= set(carry[s]) if s < nstages - 1 else set()
        for gi in graph.inputs:
            if gi.name in used:
                env[gi.name] = b.input(gi.name, gi.type.dtype, gi.type.shape)
        if s > 0:
            for k, v in enumerate(carry[s - 1]):
                t = graph.types[v]
                env[v] = b.op("recv", peer=ranks[s - 1], shape=t.shape, dtype=t.dtype, tag=tag + k)
        for n in graph.nodes[a:e]:
            ins = []
            for i in n.inputs:
                if i not in env and i in params:
                    env[i] = b.param(i, graph.weights[i])
                ins.append(env[i])
            node_attrs: dict[str, Any] = dict(n.attrs)
            res = b.op(n.op, *ins, **node_attrs)
            for name, t in zip(n.outputs, res if isinstance(res, tuple) else (res,)):
                env[name] = t
        if s < nstages - 1:
            for k, v in enumerate(carry[s]):
                b.output(b.op("send", env[v], peer=ranks[s + 1], tag=tag + k), f"sent.{v}")
        else:
            for o in graph.outputs:
                b.output(env[o], o)
        out.append(b.build())
    return out


class PipelineRunner:
    """Runs this rank's stage over micro-batches (split along axis 0 of every batched input)."""

    def __init__(self, graph: Graph, cuts: Sequence[str], *, device: str = "cpu",
                 batch_inputs: Sequence[str] | None = None) -> None:
        from ..runtime import Session
        from .runtime import world

        w = world()
        self.stages = pipeline_stages(graph, cuts)
        if len(self.stages) != w.size:
            raise IRError(f"{len(self.stages)} pipeline stages but {w.size} ranks",
                          fix=f"launch with -n {len(self.stages)}")
        self.rank = w.rank
        self.graph = self.stages[w.rank]
        self.last = w.rank == len(self.stages) - 1
        self.exe = Session(device).compile(self.graph)
        self.batch_inputs = set(batch_inputs) if batch_inputs is not None else {v.name for v in graph.inputs}

    def run(self, inputs: Mapping[str, Any], micro_batches: int = 1) -> dict[str, np.ndarray] | None:
        """The graph's outputs on the last stage (concatenated over micro-batches), None elsewhere."""
        names = {v.name for v in self.graph.inputs}
        feeds = {k: np.asarray(v) for k, v in inputs.items() if k in names}
        n = next(iter(v.shape[0] for k, v in feeds.items() if k in self.batch_inputs), 0)
        if micro_batches < 1 or (n and n % micro_batches):
            raise ShapeError(f"batch {n} does not split into {micro_batches} micro-batches",
                             fix="use a batch that is a multiple of the micro-batch count")
        k = n // micro_batches if n else 0
        results: list[dict[str, np.ndarray]] = []
        for i in range(micro_batches):
            feed = {name: (v[i * k:(i + 1) * k] if name in self.batch_inputs and k else v)
                    for name, v in feeds.items()}
            results.append(self.exe.run(feed))
        if not self.last:
            return None
        return {o: np.concatenate([r[o] for r in results], axis=0) for o in results[0]}


def collective_ops() -> list[str]:
    return [s.name for s in REGISTRY.schemas() if s.extra.get("collective")]


__all__ = ["Layout", "PipelineRunner", "Replicated", "Split", "megatron_plan", "pipeline_stages",
           "tensor_parallel"]
