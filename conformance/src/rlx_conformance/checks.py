"""The checks: generated from the op schemas (op), model graphs (graph) and the contract (contract).

Each check is a small record with a stable id (``op::add[f32]-broadcast_row``) and a ``run``
function taking the :class:`Context`. Checks never pass by default: a check that cannot run is
``skipped`` (not certified) or ``error``.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.plugin import (
    REGISTRY,
    AttrSpec,
    Backend,
    BackendInfo,
    Decomposition,
    DeviceInfo,
    DispatchError,
    DType,
    Graph,
    GraphBuilder,
    Hub,
    InputError,
    KernelClaim,
    OpSchema,
    Rewrite,
    RLXError,
    Session,
    Tensor,
    evaluate,
)

from . import graphs
from .cases import accumulation, build_case_graph, cases_for, compare, run_case


@dataclass(frozen=True)
class Outcome:
    status: str  # passed | failed | error | skipped | xfailed | xpassed
    message: str = ""
    path: str = ""
    #: What served the check's node(s): see :attr:`rlx_conformance.certificate.Result.kernels`.
    kernels: str = ""


@dataclass
class Context:
    backend: Backend
    device: DeviceInfo
    hub: Hub
    session: Session
    extra: dict[str, Any] = field(default_factory=dict)

    def new_session(self) -> Session:
        return Session(self.device.name, hub=self.hub, use_cache=False)


@dataclass(frozen=True)
class Check:
    id: str
    kind: str  # op | graph | contract
    variant: str  # what a certificate line is about: "add[f32]", "mlp[f32]", "determinism"
    run: Callable[[Context], Outcome]
    op: str = ""
    dtype: str = ""
    #: The generated case of an op check (``None`` for other kinds), and whether the check applies
    #: the op twice: what :mod:`rlx_conformance.batch` needs to merge op checks into one program.
    case: Any = None
    twice: bool = False


# ---------------------------------------------------------------------------------------------
# op checks


def served_by(exe: Any, op: str | None = None) -> str:
    """What ran the nodes (of ``op``, or all) of a compiled program, from its dispatch report:
    ``cpu.add`` (native), ``decomposition core.softmax -> k1+k2`` or ``rewrite <rule> -> k1+k2``.
    Distinct descriptions in report order, joined by ``"; "``."""
    report = getattr(exe, "report", None)
    if report is None:
        return ""
    return served_by_entries(report.entries, op)


def served_by_entries(entries: Iterable[Any], op: str | None = None) -> str:
    """:func:`served_by` of some dispatch report entries (one check's nodes of a batched program)."""
    seen: dict[str, None] = {}
    for e in entries:
        if op is not None and e.op != op:
            continue
        ks = "+".join(dict.fromkeys(e.kernels))
        if e.path == "native":
            seen[ks] = None
        else:
            how = {"common_ir": "decomposition", "rewritten": "rewrite"}.get(e.path, e.path)
            seen[f"{how} {e.via} -> {ks}"] = None
    return "; ".join(seen)


class _Compiled:
    """Hands a pre-compiled executable to :func:`~rlx_conformance.cases.run_case` (no second compile)."""

    def __init__(self, exe: Any) -> None:
        self.exe = exe

    def compile(self, graph: Graph) -> Any:
        return self.exe


def _op_check(case: Any) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        graph = build_case_graph(case)
        try:
            exe = ctx.session.compile(graph)
        except DispatchError as e:
            first = e.illegal[0].tried[0] if e.illegal and e.illegal[0].tried else e.what
            return Outcome("skipped", f"not supported by this backend: {first}")
        res = run_case(case, _Compiled(exe))
        return Outcome(res.status, res.message, res.path, served_by(exe, case.op))
    return run


def _twice_check(case: Any) -> Callable[[Context], Outcome]:
    """The op applied twice to the same inputs: a kernel that writes into an input it does not own
    (not planned in place) makes the second result wrong."""
    def run(ctx: Context) -> Outcome:
        single, graph = twice_graphs(case)
        try:
            exe = ctx.session.compile(graph)
        except DispatchError as e:
            return Outcome("skipped", f"not supported by this backend: {e.what.splitlines()[0]}")
        kernels = served_by(exe, case.op)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = twice_reference(case, single)
            got = exe.run(case.feed())
        return judge_twice(case, single, graph, got, want, kernels)
    return run


def twice_graphs(case: Any) -> tuple[Graph, Graph]:
    """The case's one-node graph and the graph applying its node twice (outputs: first, second)."""
    single = build_case_graph(case)
    node = single.nodes[0]
    g = GraphBuilder(f"{single.name}_twice")
    ins = [g.input(v.name, v.type.dtype, v.type.shape) for v in single.inputs]
    for p in single.params:
        ins.append(g.param(p.name, single.weights[p.name]))
    by = {t.name: t for t in ins}
    args = [by[i] for i in node.inputs]
    # name=None: fresh node names (the attributes never hold one)
    y1 = g.op(node.op, *args, name=None, **dict(node.attrs))
    y2 = g.op(node.op, *args, name=None, **dict(node.attrs))
    g.output(y1)
    g.output(y2)
    return single, g.build()


def twice_reference(case: Any, single: Graph) -> dict[str, np.ndarray]:
    """The reference outputs of the case, from private copies of its inputs (computed before the
    backend runs, so a backend that mutates its inputs cannot change the reference)."""
    return evaluate(single, {k: np.array(v, copy=True) for k, v in case.feed().items()})


def judge_twice(case: Any, single: Graph, graph: Graph, got: dict[str, Any], want: dict[str, np.ndarray],
                kernels: str) -> Outcome:
    """The verdict of a twice check from the backend's outputs ``got`` of ``graph``."""
    k, scale = accumulation(case, single)
    dt = single.types[single.outputs[0]].dtype
    src = DType.parse(case.inputs[0][1].dtype) if case.inputs else None
    first, second = graph.outputs
    for out in (first, second):
        msg = compare(got[out], want[single.outputs[0]], dt, case.op, k=k, scale=scale, src=src)
        if msg:
            which = "second" if out == second else "first"
            return Outcome("failed", f"{which} of two identical {case.op} nodes is wrong (a kernel "
                                     f"overwrote an input it does not own?): {msg}", kernels=kernels)
    return Outcome("passed", kernels=kernels)


def op_checks(schemas: Iterable[OpSchema] | None = None) -> list[Check]:
    out = []
    for schema in schemas if schemas is not None else REGISTRY.schemas():
        if schema.provider == "rlx-conformance":
            continue
        for dt in schema.dtypes:
            for case in cases_for(schema, dt):
                variant = f"{schema.name}[{dt.value}]"
                out.append(Check(f"op::{case.id}", "op", variant, _op_check(case), op=schema.name,
                                 dtype=dt.value, case=case))
                if case.kind == "basic" and schema.num_outputs == 1 and schema.inputs:
                    out.append(Check(f"op::{case.id}-twice", "op", variant, _twice_check(case),
                                     op=schema.name, dtype=dt.value, case=case, twice=True))
    return out


# ---------------------------------------------------------------------------------------------
# graph checks (model-shaped graphs, compared with the float64 reference)


def graph_checks() -> list[Check]:
    out = []
    for gc in graphs.graph_cases(dtypes=("f32", "f16")):
        def run(ctx: Context, gc: Any = gc) -> Outcome:
            try:
                exe = ctx.session.compile(gc.graph)
            except DispatchError as e:
                return Outcome("skipped", f"not supported by this backend: {e.what.splitlines()[0]}")
            res = graphs.check_graph(gc, ctx.session)
            return Outcome(res.status, res.message, res.path, served_by(exe))
        variant = gc.id.split("::", 1)[-1]
        out.append(Check(gc.id, "graph", variant, run, dtype=str(getattr(gc, "dtype", ""))))
    return out


# ---------------------------------------------------------------------------------------------
# contract checks


def _mlp(seed: int = 0, dtype: str = "f32") -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    npdt = DType.parse(dtype).np
    g = GraphBuilder("conformance_mlp")
    x = g.input("x", dtype, ("batch", 12))
    w1 = g.param("w1", (rng.standard_normal((12, 24)) * 0.3).astype(npdt))
    b1 = g.param("b1", rng.standard_normal(24).astype(npdt))
    w2 = g.param("w2", (rng.standard_normal((24, 5)) * 0.3).astype(npdt))
    h = g.op("relu", x @ w1 + b1)
    g.output(g.softmax(h @ w2), "probs")
    return g.build(), {"x": rng.standard_normal((6, 12)).astype(npdt)}


def _branchy(seed: int = 1) -> tuple[Graph, dict[str, np.ndarray]]:
    """Many values with overlapping lifetimes: buffer reuse bugs corrupt its outputs."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder("conformance_branchy")
    x = g.input("x", "f32", (4, 8))
    w = g.param("w", (rng.standard_normal((8, 8)) * 0.4).astype(np.float32))
    h = x
    skips: list[Tensor] = []
    for i in range(5):
        a = (h @ w) * 0.5
        b = a * a + h
        h = a + b + (skips[-1] if skips else h)
        skips.append(h)
        if i % 2:
            h = g.softmax(h)
    g.output(h, "out")
    g.output(skips[1], "early")
    return g.build(), {"x": rng.standard_normal((4, 8)).astype(np.float32)}


def _compile_or_skip(ctx: Context, graph: Graph) -> Any:
    try:
        return ctx.session.compile(graph)
    except DispatchError as e:
        raise _Skip(f"the contract graph needs ops this backend lacks: {e.what.splitlines()[0]}") from e


class _Skip(Exception):
    pass


def _contract(fn: Callable[[Context], Outcome]) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        try:
            return fn(ctx)
        except _Skip as e:
            return Outcome("skipped", str(e))
    return run


def c_records(ctx: Context) -> Outcome:
    import rlx_core

    b = ctx.backend
    problems = []
    if not isinstance(b.info, BackendInfo):
        problems.append("rlx_backend_info did not return BackendInfo")
    if b.info.api_major != int(rlx_core.API_VERSION.split(".")[0]):
        problems.append(f"API {b.info.api_version} vs core {rlx_core.API_VERSION}")
    devs = b.devices()
    if not devs or not all(isinstance(d, DeviceInfo) for d in devs):
        problems.append("rlx_probe_devices must return a non-empty list of DeviceInfo")
    for d in devs:
        if d.backend != b.name:
            problems.append(f"device {d.name} says backend {d.backend!r}, not {b.name!r}")
        if not d.name.startswith(b.name + ":"):
            problems.append(f"device name {d.name!r} should be '{b.name}:<index>'")
    claims = [c for cs in b.claims(ctx.device).values() for c in cs]
    if not claims:
        problems.append("rlx_kernels returned no claims")
    names = [c.name for c in claims]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        problems.append(f"duplicate kernel names {dups}")
    for c in claims:
        if not isinstance(c, KernelClaim):
            problems.append(f"{c!r} is not a KernelClaim")
        elif c.op not in REGISTRY:
            problems.append(f"kernel {c.name} claims unknown op {c.op!r}")
    for r in b.list_of("rlx_decompositions", Decomposition):
        if r.op not in REGISTRY:
            problems.append(f"decomposition {r.name} is for unknown op {r.op!r}")
    b.list_of("rlx_rewrites", Rewrite)
    if problems:
        return Outcome("failed", "; ".join(problems))
    return Outcome("passed", f"{len(claims)} kernel claims on {ctx.device.name}")


#: Compiles tried per claimed kernel before it counts as not exercised: bounded because a
#: compile can be costly (firmware, RTL); enough for a claim that takes one dtype of many
#: (cpu.div_int) or one case kind of a dtype (a depthwise conv).
_NATIVE_TRIES = 32


def _round_robin(schema: OpSchema, dtypes: list[DType]) -> Iterator[Any]:
    """The i-th case of every dtype before the (i+1)-th of any, so neither a dtype served by another
    kernel nor a case kind a claim rejects uses up the budget; cases generated only when reached."""
    made: dict[DType, list[Any]] = {}
    for i in itertools.count():
        left = False
        for dt in dtypes:
            if dt not in made:
                made[dt] = [c for c in cases_for(schema, dt) if c.kind != "out_of_range"]
            if i < len(made[dt]):
                left = True
                yield made[dt][i]
        if not left:
            return


def _claim_programs(ctx: Context, done: set[str]) -> tuple[list[tuple[str, Any, dict[str, Any]]], list[str]]:
    """Per claimed kernel not in ``done``: one compiled op case whose report names it, with its feed.

    Returns those programs and the kernels no case exercised (claimed, but every case tried was
    rejected by the claim or served by another kernel or path)."""
    programs: list[tuple[str, Any, dict[str, Any]]] = []
    missed: list[str] = []
    claims = sorted((c for cs in ctx.backend.claims(ctx.device).values() for c in cs), key=lambda c: c.name)
    for claim in claims:
        if claim.name in done or claim.op not in REGISTRY:
            continue
        schema = REGISTRY.get(claim.op)
        # f32 first (the dtype most claims serve natively); out_of_range cases stop before any kernel.
        dtypes = [dt for dt in sorted(schema.dtypes, key=lambda d: d != DType.F32)
                  if claim.dtypes is None or dt in claim.dtypes or not schema.inputs]
        found = False
        for case in itertools.islice(_round_robin(schema, dtypes), _NATIVE_TRIES):
            try:
                exe = ctx.session.compile(build_case_graph(case))
            except RLXError:
                continue  # the op checks report a case that does not compile
            if exe.report is not None and any(claim.name in e.kernels for e in exe.report.entries):
                programs.append((case.id, exe, case.feed()))
                done.update(k for e in exe.report.entries for k in e.kernels)
                found = True
                break
        if not found:
            missed.append(claim.name)
    return programs, missed


def c_native_ran(ctx: Context) -> Outcome:
    """Every kernel the dispatch report says ran natively was called by the compiled program.

    Checked on two small models when the backend compiles them, and on one op case per claimed
    kernel, so a backend that claims a single op (no matmul, no softmax) is checked too."""
    programs: list[tuple[str, Any, dict[str, Any]]] = []
    for graph, feed in (_mlp(), _branchy()):
        try:
            programs.append((graph.name, ctx.session.compile(graph), feed))
        except DispatchError:
            continue  # a model needs ops this backend lacks; its claimed ops are checked one by one
    done = {k for _, exe, _ in programs if exe.report is not None
            for e in exe.report.entries for k in e.kernels}
    more, missed = _claim_programs(ctx, done)
    checked = 0
    ran: set[str] = set()
    for label, exe, feed in programs + more:
        out, counts = exe.profile(feed)
        if counts is None:
            raise _Skip("the compiled program has no profile(); kernel calls cannot be counted")
        for e in exe.report.entries:
            for k in e.kernels:
                checked += 1
                if counts.get(k, 0) < 1:
                    return Outcome("failed", f"{label}: report says node {e.node!r} ran {k} ({e.path}) but "
                                             f"the program never called it (calls: {dict(counts)})")
                ran.add(k)
    if not checked:
        raise _Skip("no conformance case compiled to a claimed kernel, so kernel calls could not be "
                    f"counted (claims tried: {', '.join(missed) or 'none'})")
    note = f"; not exercised by any case: {', '.join(missed)}" if missed else ""
    return Outcome("passed", f"{checked} kernel uses in {len(programs) + len(more)} programs verified by "
                             f"call counts ({len(ran)} distinct kernels){note}")


_PROBE = "rlx_conformance.unclaimable"


def _ensure_probe_op() -> None:
    if _PROBE not in REGISTRY:
        REGISTRY.register(OpSchema(
            _PROBE, ("x",), lambda ts, a: [ts[0]], lambda xs, a: [xs[0] * 2],
            attrs=(AttrSpec("tag", "int", default=0),), category="elementwise",
            provider="rlx-conformance", doc="an op no backend claims (tests the failure path)"))


def c_unsupported_fails(ctx: Context) -> Outcome:
    _ensure_probe_op()
    try:
        return _unsupported_fails(ctx)
    finally:
        # The probe op exists only for this check; keep it out of everyone's op registry.
        REGISTRY.unregister(_PROBE)


def _unsupported_fails(ctx: Context) -> Outcome:
    g = GraphBuilder("conformance_unsupported")
    x = g.input("x", "f32", (3,))
    g.output(g.op(_PROBE, x, name="probe"))
    try:
        exe = ctx.session.compile(g.build())
    except DispatchError as e:
        msg = str(e)
        if not e.illegal or e.illegal[0].node != "probe" or _PROBE not in msg:
            return Outcome("failed", f"DispatchError does not name the node and op: {msg[:300]}")
        return Outcome("passed", "unsupported variant fails compilation and names the node")
    except Exception as e:
        return Outcome("failed", f"expected DispatchError, got {type(e).__name__}: {e}")
    report = exe.report.to_text()[:300] if exe.report is not None else "no dispatch report"
    return Outcome("failed", f"an op nobody claims compiled (fallback?): {report}")


def c_costs(ctx: Context) -> Outcome:
    def mm(n: int) -> Graph:
        g = GraphBuilder("cost")
        a = g.input("a", "f32", (n, n))
        g.output(a @ a)
        return g.build()

    try:
        small = ctx.session.plan(mm(16))
        big = ctx.session.plan(mm(256))
    except DispatchError as e:
        raise _Skip(f"matmul f32 unsupported: {e.what.splitlines()[0]}") from e
    es, eb = small.total_seconds, big.total_seconds
    if not (es > 0 and eb > 0):
        return Outcome("failed", f"costs must be positive: {es} and {eb}")
    if not eb > es:
        return Outcome("failed", f"cost of 256^3 matmul ({eb}) is not above 16^3 ({es})")
    for entry in small.entries + big.entries:
        if not entry.seconds > 0:
            return Outcome("failed", f"kernel cost of {entry.node} is {entry.seconds}")
    return Outcome("passed", f"16^3: {es:.3g}s, 256^3: {eb:.3g}s")


def c_determinism(ctx: Context) -> Outcome:
    graph, feed = _mlp()
    exe = _compile_or_skip(ctx, graph)
    a = exe.run(feed)["probs"]
    b = exe.run(feed)["probs"]
    c = ctx.new_session().compile(graph).run(feed)["probs"]
    if not (np.array_equal(a, b, equal_nan=True) and np.array_equal(a, c, equal_nan=True)):
        return Outcome("failed", "two runs of the same graph and inputs are not bit-equal")
    return Outcome("passed", "3 runs bit-equal")


def c_threads(ctx: Context) -> Outcome:
    graph, feed = _mlp(3)
    want = _compile_or_skip(ctx, graph).run(feed)["probs"]
    errors: list[str] = []

    def work() -> None:
        try:
            exe = ctx.new_session().compile(graph)
            for _ in range(10):
                if not np.array_equal(exe.run(feed)["probs"], want, equal_nan=True):
                    errors.append("result differs under concurrency")
                    return
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        return Outcome("failed", "two sessions in two threads: " + errors[0])
    return Outcome("passed", "2 threads x 10 runs bit-equal")


def c_memory_reuse(ctx: Context) -> Outcome:
    graph, feed = _branchy()
    exe = _compile_or_skip(ctx, graph)
    got = exe.run(feed)
    want = evaluate(graph, feed)
    for k in want:
        if not np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5):
            err = float(np.max(np.abs(got[k] - want[k])))
            return Outcome("failed", f"output {k!r} wrong by {err:.3g}: buffer reuse corrupted a value")
    prog = exe.program()
    return Outcome("passed", f"arena {prog.plan.arena_bytes} B vs naive {prog.plan.naive_bytes} B")


def c_input_validation(ctx: Context) -> Outcome:
    graph, feed = _mlp()
    exe = _compile_or_skip(ctx, graph)
    try:
        exe.run({"x": feed["x"].astype(np.float64)})
    except InputError:
        return Outcome("passed", "wrong input dtype rejected before reaching the backend")
    except RLXError as e:
        return Outcome("failed", f"expected InputError, got {type(e).__name__}: {e.what}")
    return Outcome("failed", "an f64 input was accepted for an f32 graph input")


def c_symbolic(ctx: Context) -> Outcome:
    graph, _ = _mlp(5)
    exe = _compile_or_skip(ctx, graph)
    rng = np.random.default_rng(9)
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 12)).astype(np.float32)
        got = exe.run(x=x)["probs"]
        want = evaluate(graph, {"x": x})["probs"]
        if got.shape != (batch, 5) or not np.allclose(got, want, rtol=1e-4, atol=1e-6):
            return Outcome("failed", f"batch={batch}: wrong shape {got.shape} or values")
    return Outcome("passed", "specialised for batch 1, 3, 8")


def c_hostile_names(ctx: Context) -> Outcome:
    """Graph, node, input and parameter names from a model file are data: names that would be code
    in a careless generator (newlines in comments, ``*/``, quotes, ``$system``, NUL, U+2028, 10k
    characters; :mod:`rlx_conformance.hostile`) compile and give the reference's numbers."""
    from .hostile import MARKER, hostile_graph, hostile_graph_count

    before = os.path.exists(MARKER)
    ran = 0
    for k in range(hostile_graph_count()):
        graph, feed = hostile_graph(k)
        try:
            exe = ctx.session.compile(graph)
        except DispatchError as e:
            raise _Skip(f"add/reshape f32 unsupported: {e.what.splitlines()[0]}") from e
        except RLXError as e:
            return Outcome("failed", f"graph {k} with hostile names did not compile: {type(e).__name__}: "
                                     f"{e.what[:300]}")
        got = exe.run(feed)
        want = evaluate(graph, feed)
        for name, ref in want.items():
            if name not in got:
                return Outcome("failed", f"graph {k}: output {name[:40]!r} is missing (names mangled?)")
            if not np.allclose(got[name], ref, rtol=1e-5, atol=1e-6):
                return Outcome("failed", f"graph {k}: output {name[:40]!r} differs from the reference")
        ran += 1
    if not before and os.path.exists(MARKER):
        return Outcome("failed", f"a hostile name ran code: {MARKER!r} appeared in the working directory")
    return Outcome("passed", f"{ran} graphs with hostile names equal the reference")


CONTRACT: dict[str, Callable[[Context], Outcome]] = {
    "records": c_records,
    "native_kernels_ran": c_native_ran,
    "unsupported_variant_fails": c_unsupported_fails,
    "costs_positive_and_growing": c_costs,
    "determinism": c_determinism,
    "two_sessions_two_threads": c_threads,
    "memory_reuse_no_corruption": c_memory_reuse,
    "input_validation": c_input_validation,
    "symbolic_specialisation": c_symbolic,
    "hostile_names": c_hostile_names,
}


def contract_checks() -> list[Check]:
    return [Check(f"contract::{name}", "contract", name, _contract(fn)) for name, fn in CONTRACT.items()]


def collect() -> list[Check]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return contract_checks() + op_checks() + graph_checks()
