"""LIR: the per-backend program. Kernels in order, explicit transfers, and a buffer plan.

The memory planner gives each value an offset in one arena by liveness: a buffer is reused once
its value is dead, and an elementwise kernel whose claim allows it writes over a dying input of
the same size (in place). Weights are not in the arena: they are constants the backend uploads once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .dispatch import Legalized
from .errors import DispatchError
from .ir.graph import Graph, Value
from .ir.types import Attrs, TensorType

ALIGN = 64

#: Where an :class:`Access` lands: the program's arena (``BufferPlan`` offsets), a constant
#: (a weight: never written) or host memory (a transfer's host side).
Space = Literal["arena", "const", "host"]
#: The ordering a later step must keep with an earlier one: read after write, write after read,
#: write after write.
Hazard = Literal["RAW", "WAR", "WAW"]


@dataclass(frozen=True)
class Access:
    """Bytes ``offset:offset + size`` of ``space`` that a step reads or writes as value ``value``.

    ``buffer`` is the value that owns those bytes in the plan: ``value`` itself, or the root of the
    in-place / reshape alias the planner resolved (the planner's reuse of a dead value's bytes by a
    later value shows as the same arena range under two names). Outside the arena (``const``,
    ``host``) ``offset`` is 0 and two accesses meet when they name the same buffer."""

    value: str
    buffer: str
    offset: int
    size: int
    space: Space = "arena"

    @property
    def end(self) -> int:
        return self.offset + self.size

    def meets(self, other: Access) -> bool:
        """Do the two accesses share at least one byte? (Empty ones meet nothing.)"""
        if self.space != other.space or self.size <= 0 or other.size <= 0:
            return False
        if self.space != "arena":
            return self.buffer == other.buffer
        return self.offset < other.end and other.offset < self.end


@dataclass(frozen=True)
class Step:
    """Run one kernel: ``kernel`` is the name of the claim the dispatcher chose.

    ``reads`` / ``writes``: what it touches (one :class:`Access` per distinct input / output),
    filled by :func:`lower` from the buffer plan, so a backend can order or overlap steps with
    :func:`conflicts` instead of comparing pointers. Empty on a step that has not been lowered."""

    node: str
    op: str
    kernel: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs
    origin: str
    path: str
    in_place: bool = False
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()


@dataclass(frozen=True)
class Transfer:
    """Copy a value between host memory and the device (or between devices).

    ``reads`` / ``writes`` as on :class:`Step`: host to device reads the value's host copy and
    writes its arena bytes, device to host the other way round."""

    value: str
    src: str
    dst: str
    nbytes: int
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()


def conflicts(first: Step | Transfer, then: Step | Transfer) -> tuple[Hazard, ...]:
    """The hazards that keep ``then`` after ``first`` (``first`` comes earlier in the program):
    ``RAW`` (``then`` reads bytes ``first`` writes), ``WAR`` (``then`` writes bytes ``first``
    reads), ``WAW`` (both write the same bytes). Empty: the two may run in either order or at once."""
    out: list[Hazard] = []
    if any(w.meets(r) for w in first.writes for r in then.reads):
        out.append("RAW")
    if any(r.meets(w) for r in first.reads for w in then.writes):
        out.append("WAR")
    if any(w.meets(x) for w in first.writes for x in then.writes):
        out.append("WAW")
    return tuple(out)


@dataclass(frozen=True)
class BufferPlan:
    offsets: Mapping[str, int]
    sizes: Mapping[str, int]
    arena_bytes: int
    naive_bytes: int
    alignment: int = ALIGN
    #: value -> the value whose buffer it took over (in place, or a reshape), for every alias
    aliases: Mapping[str, str] = field(default_factory=dict)

    def overlaps(self, a: str, b: str) -> bool:
        oa, ob = self.offsets[a], self.offsets[b]
        return oa < ob + self.sizes[b] and ob < oa + self.sizes[a]

    def access(self, graph: Graph, value: str) -> Access:
        """Where ``value`` lives: its arena bytes, or (not planned: a weight) a constant."""
        nbytes = graph.types[value].nbytes()
        if value not in self.offsets:
            return Access(value, value, 0, nbytes, "const")
        return Access(value, self.aliases.get(value, value), self.offsets[value], nbytes)


@dataclass(frozen=True)
class Program:
    backend: str
    device: str
    graph: Graph
    steps: tuple[Step | Transfer, ...]
    plan: BufferPlan
    inputs: tuple[Value, ...]
    #: (public output name, value name in ``graph``)
    outputs: tuple[tuple[str, str], ...]
    fingerprint: str

    @property
    def kernels(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if isinstance(s, Step))

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(s for s in self.steps if isinstance(s, Transfer))

    def type_of(self, value: str) -> TensorType:
        return self.graph.types[value]

    def conflicts(self, i: int, j: int) -> tuple[Hazard, ...]:
        """The hazards between ``steps[i]`` and ``steps[j]`` (in program order: the earlier one
        first): empty when they may run in either order or at once. See :func:`conflicts`."""
        a, b = self.steps[min(i, j)], self.steps[max(i, j)]
        return conflicts(a, b) if i != j else ()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(graph: Graph, steps: list[Step], keep: set[str],
                reuse_distance: int = 0) -> tuple[BufferPlan, list[Step]]:
    """Assign arena offsets by liveness (greedy by size, best offset), with in-place reuse.

    ``reuse_distance``: steps a buffer stays reserved after its value's last use (the device's
    :attr:`~rlx_core.records.DeviceInfo.reuse_distance`)."""
    n = len(steps)
    params = {p.name for p in graph.params}
    first: dict[str, int] = {v.name: -1 for v in graph.inputs}
    last: dict[str, int] = {v.name: -1 for v in graph.inputs}
    for i, s in enumerate(steps):
        for o in s.outputs:
            first[o] = i
            last[o] = i
        for x in s.inputs:
            if x in last:
                last[x] = i
    for k in keep:
        if k in last:
            last[k] = n
    sizes = {v: max(graph.types[v].nbytes(), 1) for v in first}
    # In place: the output takes over a dying input's buffer of the same size.
    alias: dict[str, str] = {}
    new_steps = []
    for i, s in enumerate(steps):
        done = False
        if s.in_place and len(s.outputs) == 1:
            o = s.outputs[0]
            for x in s.inputs:
                root = alias.get(x, x)
                # A reshape keeps the row-major bytes, so its output may take over its input even
                # though the shape differs; other ops must match element for element.
                same_layout = graph.types[x].shape == graph.types[o].shape or s.op == "reshape"
                if (x not in params and x in last and last[x] == i and sizes[x] == sizes[o]
                        and s.inputs.count(x) == 1 and same_layout and last.get(root, -2) <= i):
                    alias[o] = root
                    last[root] = max(last[root], last[o])
                    done = True
                    break
        new_steps.append(Step(s.node, s.op, s.kernel, s.inputs, s.outputs, s.attrs, s.origin, s.path,
                              done) if done != s.in_place else s)
    if reuse_distance:
        # Applied after in-place aliasing (which needs the true last use): the buffer stays
        # reserved for `reuse_distance` more steps before another value may take it.
        for v in last:
            if last[v] >= 0:
                last[v] = min(n, last[v] + reuse_distance)
    roots = [v for v in first if v not in alias]
    order = sorted(roots, key=lambda v: (-sizes[v], first[v]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[str, int] = {}
    for v in order:
        size = _align(sizes[v])
        lo, hi = first[v], last[v]
        busy = sorted((o, o + sz) for o, sz, f, l in placed if not (l < lo or f > hi))
        off = 0
        best: int | None = None
        best_gap = None
        for b0, b1 in busy:
            if b0 - off >= size:
                gap = b0 - off
                if best_gap is None or gap < best_gap:
                    best, best_gap = off, gap
            off = max(off, b1)
        if best is None:
            best = off
        offsets[v] = best
        placed.append((best, size, lo, hi))
    for o, root in alias.items():
        offsets[o] = offsets[root]
    arena = max((o + _align(sz) for o, sz, _, _ in placed), default=0)
    naive = sum(_align(sizes[v]) for v in first)
    return BufferPlan(offsets, sizes, arena, naive, aliases=alias), new_steps


def with_access(graph: Graph, plan: BufferPlan, step: Step | Transfer) -> Step | Transfer:
    """``step`` with its ``reads`` / ``writes`` taken from ``plan`` (see :class:`Access`)."""
    if isinstance(step, Transfer):
        dev = plan.access(graph, step.value)
        host = Access(step.value, step.value, 0, dev.size, "host")
        reads, writes = ((host,), (dev,)) if step.src == "host" else ((dev,), (host,))
        return replace(step, reads=reads, writes=writes)
    return replace(step, reads=tuple(plan.access(graph, v) for v in dict.fromkeys(step.inputs)),
                   writes=tuple(plan.access(graph, v) for v in dict.fromkeys(step.outputs)))


def lower(legal: Legalized, device: Any, carry: Mapping[str, str] | None = None) -> Program:
    """Turn a legalized static graph into an LIR program for ``device``.

    ``carry`` maps graph inputs to the public outputs whose values the caller feeds back into them
    between runs (parameters and optimizer state, kept resident in the program's buffers): each
    such input ends up either sharing its output's bytes (the update ran in place: nothing to
    move) or live to the end of the run, so copying the output onto it afterwards clobbers no
    other output."""
    g = legal.graph
    if not g.is_static:
        syms = ", ".join(sorted(g.symbols))
        raise DispatchError(f"graph {g.name!r} still has symbolic dims ({syms}) at lowering",
                            fix="bind them: Executable.run specialises on the input shapes")
    steps: list[Step] = []
    for node in g.nodes:
        a = legal.assignments[node.name]
        steps.append(Step(node.name, node.op, a.claim.name, node.inputs, node.outputs, node.attrs,
                          a.origin, a.path, a.claim.in_place))
    keep = {v for _, v in legal.outputs}
    reuse = getattr(device, "reuse_distance", 0)
    plan, planned = plan_memory(g, steps, keep, reuse)
    outs = dict(legal.outputs)
    pairs = [(i, outs[o]) for i, o in (carry or {}).items()]
    kept: set[str] = set()
    while True:
        # Keeping an input alive can undo another pair's in-place update: plan until stable.
        apart = {i for i, o in pairs if plan.offsets[i] != plan.offsets[o]}
        if apart <= kept:
            break
        kept |= apart
        plan, planned = plan_memory(g, steps, keep | kept, reuse)
    steps = planned
    all_steps: list[Step | Transfer] = []
    if not device.host_memory:
        for v in g.inputs:
            all_steps.append(Transfer(v.name, "host", device.name, v.type.nbytes()))
    all_steps.extend(steps)
    if not device.host_memory:
        for _pub, out in legal.outputs:
            all_steps.append(Transfer(out, device.name, "host", g.types[out].nbytes()))
    return Program(legal.backend, device.name, g, tuple(with_access(g, plan, s) for s in all_steps),
                   plan, g.inputs, legal.outputs, g.fingerprint)
