"""Batched op checks: independent op checks of one op compiled and run as ONE program.

A backend whose cost is per compiled program (a whole-program compiler such as XLA: tens of ms to
compile even one node) opts in by giving its plugin module an integer ``CONFORMANCE_BATCH`` (the
most checks per program; absent, 0 or 1 keeps the one-program-per-check route). Then consecutive
op checks of the same op (``add[f32]``, ``add[f16]``...: the cases and their ``-twice`` checks) are
merged into one graph of disjoint subgraphs, every name prefixed by the check's slot (``m3/x``),
compiled once and run once; each check's outputs, inputs and dispatch-report entries (its nodes
only) are then judged exactly as the one-check route judges them (:func:`run_case`,
:func:`~rlx_conformance.checks.judge_twice`, :func:`~rlx_conformance.checks.served_by`).

A batch result is only ever used when it says ``passed``. Anything else (a check that fails or
errs in the batch, a batch that does not compile or run, a check whose nodes are missing from the
report) re-runs that batch's checks one by one on the one-check route, so every failure, error
and skip is produced, worded and attributed exactly as without batching. A check the backend does
not support (a :class:`~rlx_core.plugin.DispatchError` naming its nodes) leaves the batch and is
skipped on its own, and the rest of the batch is compiled again.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.plugin import DispatchError, DType, Graph, GraphBuilder, evaluate

from .cases import accumulation, build_case_graph, compare
from .checks import Check, Context, Outcome, judge_twice, served_by_entries, twice_graphs, twice_reference

#: The plugin-module attribute a backend sets to opt in (the most checks per program).
ATTRIBUTE = "CONFORMANCE_BATCH"


def batch_size(ctx: Context) -> int:
    """The backend's ``CONFORMANCE_BATCH`` (0 when it does not opt in or gives no usable integer)."""
    size = getattr(ctx.backend.plugin, ATTRIBUTE, 0)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else 0


def batchable(check: Check) -> bool:
    """An op check with its case attached, whose case runs (an ``out_of_range`` case must raise at
    run time: it stays on its own, where that error belongs to it alone)."""
    return check.kind == "op" and check.case is not None and check.case.kind != "out_of_range"


@dataclass
class _Member:
    check: Check
    prefix: str
    graph: Graph  # the graph the one-check route compiles for this check
    single: Graph  # the case's one-node graph (the reference's)
    feed: dict[str, np.ndarray]
    outputs: dict[str, str] = field(default_factory=dict)  # graph output -> merged output
    nodes: set[str] = field(default_factory=set)  # merged node names of this check


def _member(check: Check, slot: int) -> _Member:
    case = check.case
    if check.twice:
        single, graph = twice_graphs(case)
    else:
        single = graph = build_case_graph(case)
    return _Member(check, f"m{slot}/", graph, single, case.feed())


def _merge(members: list[_Member], name: str) -> Graph:
    """One graph holding every member's graph, names prefixed, nothing shared between members."""
    g = GraphBuilder(name)
    for m in members:
        src, p = m.graph, m.prefix
        by = {v.name: g.input(p + v.name, v.type.dtype, v.type.shape) for v in src.inputs}
        for v in src.params:
            by[v.name] = g.param(p + v.name, src.weights[v.name])
        for n in src.nodes:
            outs = g.op(n.op, *[by[i] for i in n.inputs], name=p + n.name, **dict(n.attrs))
            by.update(zip(n.outputs, outs if isinstance(outs, tuple) else (outs,)))
            m.nodes.add(p + n.name)
        for o in src.outputs:
            m.outputs[o] = g.output(by[o]).name
    return g.build()


def _judge(m: _Member, exe: Any, got: dict[str, Any], want: dict[str, np.ndarray],
           before: dict[str, np.ndarray]) -> Outcome:
    """One member's outcome from the batch's outputs, as the one-check route would judge it."""
    case = m.check.case
    entries = [e for e in exe.report.entries if e.node in m.nodes]
    if not entries:
        return Outcome("error", "no dispatch-report entry for this check's nodes in the batch")
    mine = {o: got[merged] for o, merged in m.outputs.items() if merged in got}
    kernels = served_by_entries(entries, case.op)
    if m.check.twice:
        if len(mine) != len(m.outputs):
            return Outcome("error", "an output is missing from the batch's results")
        return judge_twice(case, m.single, m.graph, mine, want, kernels)
    # As run_case: the path, the caller's inputs untouched, then every output against the reference.
    path = ",".join(dict.fromkeys(e.path for e in entries))
    for n, v in m.feed.items():
        if not np.array_equal(np.asarray(v), before[n], equal_nan=True):
            return Outcome("failed", f"the backend modified the caller's input {n!r}", path, kernels)
    k, scale = accumulation(case, m.graph)
    src = DType.parse(case.inputs[0][1].dtype) if case.inputs else None
    problems = []
    for name in m.graph.outputs:
        if name not in mine:
            problems.append(f"output {name!r} missing")
            continue
        msg = compare(mine[name], want[name], m.graph.types[name].dtype, case.op, k=k, scale=scale, src=src)
        if msg:
            problems.append(msg)
    if problems:
        return Outcome("failed", "; ".join(problems), path, kernels)
    return Outcome("passed", "", path, kernels)


@dataclass
class _Built:
    """A batch compiled (possibly in a worker thread): its members, those still in it, the program."""
    checks: list[Check]
    members: list[_Member] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    exe: Any = None


def compile_batch(checks: list[Check], session: Any) -> _Built:
    """Merge ``checks`` into one graph and compile it on ``session``; a check whose node the
    backend does not support leaves the batch (it runs on its own). ``exe`` stays ``None`` when
    the batch cannot vouch for any check. Thread-safe given a session of its own."""
    built = _Built(checks)
    try:
        built.members = members = [_member(c, i) for i, c in enumerate(checks)]
    except Exception:
        return built
    left = list(range(len(members)))
    while left:
        for m in members:
            m.outputs.clear()
            m.nodes.clear()
        try:
            graph = _merge([members[i] for i in left], f"conformance_batch_{checks[0].op}")
            exe = session.compile(graph)
        except DispatchError as e:
            # A decomposed node's parts keep its name as prefix: the slot prefix finds the check.
            bad = [il.node for il in e.illegal]
            drop = [i for i in left if any(b.startswith(members[i].prefix) for b in bad)]
            if not drop:  # the error names no check's node: nothing to attribute it to
                return built
            left = [i for i in left if i not in drop]
            continue
        except Exception:
            return built
        if exe.report is not None:
            built.left, built.exe = left, exe
        return built
    return built


def judge_batch(built: _Built) -> list[Outcome | None]:
    """Run a compiled batch once and judge every check in it; ``None`` for a check to run on its
    own. All ``None`` unless every check that stayed in the batch passed."""
    none: list[Outcome | None] = [None] * len(built.checks)
    if built.exe is None:
        return none
    out = list(none)
    members, left, exe = built.members, built.left, built.exe
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # References first, from private copies (as run_case and the twice check do).
            wants = {i: (twice_reference(members[i].check.case, members[i].single) if members[i].check.twice
                         else evaluate(members[i].graph,
                                       {k: np.array(v, copy=True) for k, v in members[i].feed.items()}))
                     for i in left}
            feed = {members[i].prefix + n: v for i in left for n, v in members[i].feed.items()}
            before = {n: np.array(v, copy=True) for n, v in feed.items()}
            got = exe.run(feed)
            for i in left:
                m = members[i]
                out[i] = _judge(m, exe, got, wants[i], {n: before[m.prefix + n] for n in m.feed})
        except Exception:
            return none
    if any(out[i] is None or out[i].status != "passed" for i in left):  # type: ignore[union-attr]
        return none
    return out


def run_batch(checks: list[Check], ctx: Context) -> list[Outcome | None]:
    """:func:`compile_batch` then :func:`judge_batch`, in this thread, on the context's session."""
    return judge_batch(compile_batch(checks, ctx.session))


def workers() -> int:
    """Threads compiling batches ahead of the one being judged: compilers (XLA's) release the GIL,
    so on a machine with free cores the next programs compile while this one runs."""
    return max(1, min(8, (os.cpu_count() or 1)))


def run_batched(todo: list[Check], ctx: Context, size: int,
                one: Callable[[Check, Outcome | None], None]) -> None:
    """Run ``todo`` in order: consecutive batchable checks of one op (at most ``size``; its variants,
    i.e. dtypes, follow one another) as one program, compiled ahead in :func:`workers` threads (one
    session each). ``one(check, outcome)`` is called once per check, in ``todo``'s order, in this
    thread, with the batch's outcome or ``None`` (then the caller runs the check on its own)."""
    groups: list[list[Check]] = []
    i = 0
    while i < len(todo):
        c = todo[i]
        j = i + 1
        if batchable(c):
            while j < len(todo) and j - i < size and batchable(todo[j]) and todo[j].op == c.op:
                j += 1
        groups.append(todo[i:j])
        i = j
    local = threading.local()

    def build(group: list[Check]) -> _Built:
        if not hasattr(local, "session"):
            local.session = ctx.new_session()
        return compile_batch(group, local.session)

    n = workers()
    with ThreadPoolExecutor(n, thread_name_prefix="rlx-conformance-batch") as pool:
        ahead: dict[int, Future[_Built]] = {}
        for g, group in enumerate(groups):
            if not batchable(group[0]):
                # A contract or graph check may change shared state (the contract registers and
                # removes a probe op): nothing compiles beside it.
                for f in ahead.values():
                    f.exception()
            else:
                # Keep the next few batches compiling while this one is judged.
                for k in range(g, min(len(groups), g + n + 1)):
                    if k not in ahead and len(groups[k]) > 1:
                        ahead[k] = pool.submit(build, groups[k])
            outcomes = judge_batch(ahead.pop(g).result()) if g in ahead else [None] * len(group)
            for check, outcome in zip(group, outcomes):
                one(check, outcome)
