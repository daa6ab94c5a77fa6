"""Sessions and executables: ``Session("cpu").compile(graph).run({"x": x})``."""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__, settings
from ._hub import Backend, Hub, parse_device, split_devices
from ._hub import hub as get_hub
from .costmodel import kernel_cost, transfer_cost
from .dispatch import Dispatcher, Legalized, Plan, legalize
from .errors import BackendNotFoundError, CapabilityError, DispatchError, InputError, PluginError
from .execution import DEFAULT_MAX_SPECIALIZATIONS, InputBinder, bind_inputs
from .execution import SpecCache as _SpecCache
from .execution import report_entry as _entry
from .ir.graph import Graph
from .ir.indices import check_constants as check_constant_indices
from .ir.indices import check_inputs as check_index_inputs
from .ir.indices import input_bounds as index_bounds
from .ir.indices import inputs_in_range
from .lir import Program, Transfer, lower
from .placement import MultiDeviceExecutable, place
from .records import BufferBinding, FusionRule, KernelClaim, NodeVariant
from .report import DispatchReport, TransferEntry

if TYPE_CHECKING:
    from .distributed.mesh import Mesh
    from .distributed.session import DistributedSession


class Session:
    """Compiles graphs for one device (``"cpu"``, ``"cuda:1"``) or, when several are named, places
    each node on the first device that can run it and reports every cross-device transfer.

    ``device=None`` picks the default backend (``RLX_BACKENDS`` order, else cpu).

    ``mesh`` (a :class:`rlx_core.distributed.Mesh`, e.g. ``Mesh(tp=2)``): this process is one rank
    of a launch of ``mesh.size`` processes (started by ``rlx launch -n N``, through Open MPI's
    mpirun), and :meth:`compile` forwards to :class:`rlx_core.distributed.DistributedSession`
    (``self.distributed``): it compiles this rank's tensor-parallel program of the graph
    (Megatron-style split of the attention heads and FFN, ``all_reduce`` between the ranks), whose
    outputs are the whole graph's on every rank. For pipeline stages, call
    ``self.distributed.compile(graph, cuts=[...])``. MPI (mpi4py) is loaded only when a mesh is given.
    """

    def __init__(self, device: str | Sequence[str] | None = None, *, hub: Hub | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, use_cache: bool | None = None,
                 shape_hints: Mapping[str, int] | None = None, fusion: bool | None = None,
                 lower_only: bool = False, max_specializations: int | None = None,
                 mesh: Mesh | None = None) -> None:
        """``lower_only``: the session only dispatches and lowers (:meth:`lower`, :meth:`check`:
        whole-program code generators such as ``rlx export``), so its device may be one that
        cannot run here (its toolchain or hardware is missing); :meth:`compile` then refuses.

        ``max_specializations``: how many input-shape specialisations each executable of a graph
        with symbolic dims keeps compiled (least recently used ones are dropped and recompiled when
        seen again); default ``RLX_MAX_SPECIALIZATIONS``, else 16."""
        self.hub = hub or get_hub()
        self.lower_only = lower_only
        #: Fuse elementwise chains the backend runs natively (RLX_FUSION=0 turns it off).
        self.fusion = settings.FUSION.get() if fusion is None else fusion
        names = split_devices(device) or [self.hub.default_backend()]
        self.devices: list[tuple[Backend, Any]] = []
        for spec in names:
            bname, idx = parse_device(spec)
            backend = self.hub.load(bname)
            if lower_only:
                devs = backend.devices()
                if not 0 <= (idx or 0) < len(devs):
                    raise BackendNotFoundError(f"backend {bname!r} has no device {idx or 0} (it has "
                                               f"{len(devs)})", fix="run `rlx doctor` to list devices")
                self.devices.append((backend, devs[idx or 0]))
            else:
                self.devices.append((backend, backend.device(idx)))
        self.backend, self.device = self.devices[0]
        if use_cache is None:
            use_cache = not settings.NO_CACHE.get()
        from .cache import CompileCache

        self.cache = CompileCache(cache_dir) if use_cache else None
        self.shape_hints = dict(shape_hints or {})
        self._dispatchers: dict[str, Dispatcher] = {}
        self.max_specializations = _max_specializations(max_specializations)
        self.mesh = mesh
        self.distributed: DistributedSession | None = None
        if mesh is not None:  # compiles per-rank programs through a mesh-less copy of this session
            from .distributed.session import DistributedSession

            self.distributed = DistributedSession(device, mesh, session=copy.copy(self))

    @property
    def device_names(self) -> list[str]:
        return [d.name for _, d in self.devices]

    def dispatcher(self, backend: Backend, device: Any) -> Dispatcher:
        if device.name not in self._dispatchers:
            caps = device.caps

            def cost(claim: KernelClaim, v: NodeVariant) -> float:
                return kernel_cost(backend, claim, v, caps)

            decomps = backend.list_of("rlx_decompositions", _records().Decomposition)
            rewrites = backend.list_of("rlx_rewrites", _records().Rewrite)
            self._dispatchers[device.name] = Dispatcher(
                backend, device, cost=cost, decompositions=decomps + self.hub.core_decompositions(),
                rewrites=rewrites + self.hub.core_rewrites())
        return self._dispatchers[device.name]

    def fusion_rules(self, backend: Backend) -> list[FusionRule]:
        """The backend's own fusion rules first (more specific), then the core's."""
        from .fusion import ELEMENTWISE
        from .patterns import ATTENTION, LAYER_NORM

        own = [r if r.provider else replace(r, provider=backend.name)
               for r in backend.list_of("rlx_fusion_rules", FusionRule)]
        return [*own, ATTENTION, LAYER_NORM, ELEMENTWISE]

    # -- planning --------------------------------------------------------------------------------
    def legalize(self, graph: Graph) -> tuple[Legalized, bool]:
        """Fold constants, cancel reshape pairs, fuse, then legalize for the session's (first)
        device, through the on-disk cache (keyed by the folded graph)."""
        from .fold import fold_constants
        from .reshapes import cancel_reshapes

        graph = cancel_reshapes(fold_constants(graph))
        backend, device = self.devices[0]
        variant = "fusion" if self.fusion else "nofusion"
        if self.cache is not None:
            hit = self.cache.load(graph, backend, device, variant)
            if hit is not None:
                return hit, True
        disp = self.dispatcher(backend, device)
        early: list[list[str]] = []
        rules = self.fusion_rules(backend) if self.fusion else []
        if rules:
            from . import regions

            before = graph
            graph, taken = regions.apply(graph, rules, "graph", _claims(disp))
            early = regions.groups(taken, before)
        legal = legalize(graph, disp)
        if rules:
            legal = _fuse_legalized(legal, disp, rules)
            legal.extra["fused"] = [*early, *legal.extra.get("fused", [])]
        if self.cache is not None:
            self.cache.store(graph, backend, device, legal, variant)
        return legal, False

    def report_for(self, legal: Legalized, program: Program | None, bindings: Mapping[str, int],
                   from_cache: bool) -> DispatchReport:
        backend, device = self.devices[0]
        entries = []
        kernels = legal.extra.get("kernels", {})
        for node_name, plan in legal.plans.items():
            entries.append(_entry(node_name, plan, device.name, kernels.get(node_name)))
        transfers = []
        if program is not None:
            for t in program.transfers:
                transfers.append(TransferEntry(t.value, t.src, t.dst, t.nbytes,
                                               transfer_cost(t.nbytes, device.caps)))
        return DispatchReport(legal.graph.name, backend.name, backend.info.version, device.name, entries,
                              transfers,
                              program.plan.arena_bytes if program else None,
                              program.plan.naive_bytes if program else None,
                              dict(bindings), from_cache, fused=list(legal.extra.get("fused", [])))

    def plan(self, graph: Graph, bindings: Mapping[str, int] | None = None) -> DispatchReport:
        """Dispatch and lower without compiling: the report ``rlx explain`` prints."""
        if len(self.devices) > 1:
            return place(self, graph, {**self._hints(graph), **(bindings or {})}).report
        b = {**self._hints(graph), **(bindings or {})}
        g = graph.specialize(b) if graph.symbols else graph
        legal, cached = self.legalize(g)
        program = lower(legal, self.device)
        return self.report_for(legal, program, b, cached)

    def lower(self, graph: Graph, bindings: Mapping[str, int] | None = None) -> Program:
        """Dispatch and lower ``graph`` for the (first) device without compiling it: the LIR
        program a whole-program code generator (``rlx export``) turns into source. Symbolic dims
        must be bound by ``bindings`` or the session's shape hints."""
        b = {**self._hints(graph), **(bindings or {})}
        g = graph.specialize(b) if graph.symbols else graph
        check_constant_indices(g)
        legal, _ = self.legalize(g)
        return lower(legal, self.device)

    def check(self, graph: Graph, bindings: Mapping[str, int] | None = None) -> DispatchReport:
        """Resolve every node's dispatch path without emitting or lowering anything; raises
        :class:`DispatchError` listing every illegal node. Cheap: plans are memoised per variant."""
        from .dispatch import Illegal, variant_of

        b = {**self._hints(graph), **(bindings or {})}
        g = graph.specialize(b) if graph.symbols else graph
        from .fold import fold_constants
        from .reshapes import cancel_reshapes

        g = cancel_reshapes(fold_constants(g))  # as legalize sees it: a folded node needs no kernel
        backend, device = self.devices[0]
        disp = self.dispatcher(backend, device)
        entries, illegal = [], []
        for node in g.nodes:
            v = variant_of(g, node)
            p = disp.plan(v)
            if isinstance(p, Plan):
                entries.append(_entry(node.name, p, device.name))
            else:
                illegal.append(Illegal(node.name, v, backend.name, p))
        if illegal:
            legalize(g, disp)  # raises the full DispatchError with every illegal node
        return DispatchReport(g.name, backend.name, backend.info.version, device.name, entries, [],
                              None, None, b)

    def _subsession(self, device: str) -> Session:
        # Placement compiles each segment through a one-device session sharing this one's settings.
        return Session(device, hub=self.hub, use_cache=self.cache is not None)

    def _hints(self, graph: Graph) -> dict[str, int]:
        return {s: self.shape_hints.get(s, 1) for s in sorted(graph.symbols)}

    # -- compiling -------------------------------------------------------------------------------
    def compile(self, graph: Graph, *, carry: Mapping[str, str] | None = None
                ) -> Executable | MultiDeviceExecutable:
        """Dispatch now (so illegal graphs fail here); specialise symbolic dims on first run.

        ``carry``: input -> output pairs the caller feeds back between runs through
        :meth:`Executable.buffers` (training state); the memory plan keeps them safe to copy.
        With a ``mesh``: this rank's program of ``graph`` (see the class docstring)."""
        if self.distributed is not None:
            return self.distributed.compile(graph, carry=carry)
        for _, d in self.devices:
            if not d.available:
                raise BackendNotFoundError(f"device {d.name} is unavailable: {d.reason}",
                                           fix="this session can only lower (lower_only=True); "
                                               "run `rlx doctor`, or choose another device")
        check_constant_indices(graph)  # a constant index out of range makes the graph invalid
        if len(self.devices) > 1:
            if carry:
                raise InputError("carried state needs one device", where=f"graph {graph.name!r}",
                                 fix=f"compile on one of {', '.join(self.device_names)}")
            return MultiDeviceExecutable(self, graph, self._subsession)
        exe = Executable(self, graph, carry=carry)
        if graph.symbols:
            # Fail early: resolve every node (with the shape hints) even though lowering, memory
            # planning and the backend's compile wait for the first run's real shapes.
            exe.report = self.check(graph)
        else:
            exe._specialise({})
        if settings.DISPATCH_REPORT.get() and exe.report is not None:
            print(exe.report.to_text(), file=sys.stderr)
        return exe

    def run(self, graph: Graph, inputs: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        return self.compile(graph).run(inputs, **kw)


def _max_specializations(value: int | None) -> int:
    from .errors import RLXError

    fix = "keep at least 1 specialisation, e.g. RLX_MAX_SPECIALIZATIONS=16 (unset: 16)"
    if value is None:
        count: int = settings.MAX_SPECIALIZATIONS.get()
        return count
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RLXError(f"max_specializations={value!r} is not an integer >= 1", where="Session", fix=fix)
    return value


def _native_plan(disp: Dispatcher, graph: Graph, node: Any) -> Plan | None:
    v = NodeVariant(node.op, tuple(graph.types[i] for i in node.inputs),
                    tuple(graph.types[o] for o in node.outputs), node.attrs)
    p = disp.plan(v)
    return p if isinstance(p, Plan) and p.kind == "native" else None


def _claims(disp: Dispatcher) -> Any:
    """The backend's answer to "do you take this region": it runs the node natively."""

    def claims(node: Any, ins: Any, outs: Any) -> bool:
        p = disp.plan(NodeVariant(node.op, tuple(ins), tuple(outs), node.attrs))
        return isinstance(p, Plan) and p.kind == "native"

    return claims


def _fuse_legalized(legal: Legalized, disp: Dispatcher, rules: list[FusionRule]) -> Legalized:
    """Apply the ``legal``-stage rules to the *legalized* graph (so decomposed HIR ops fuse too)
    where the backend claims the regions; kernels are re-attributed to the original nodes."""
    from . import regions
    from .dispatch import Assignment

    fused_graph, taken = regions.apply(legal.graph, rules, "legal", _claims(disp))
    legal.extra["fused"] = regions.groups(taken, legal.graph)
    if not taken:
        legal.extra["kernels"] = _kernels_by_origin(legal)
        return legal
    pos = {n.name: i for i, n in enumerate(legal.graph.nodes)}
    made: dict[str, list[str]] = {}  # new node name -> the replaced nodes
    for t in taken:
        for n in t.region.nodes:
            made[n.name] = sorted(t.region.members, key=pos.__getitem__)
    assignments: dict[str, Assignment] = {}
    for node in fused_graph.nodes:
        if node.name in made:
            members = made[node.name]
            plan = _native_plan(disp, fused_graph, node)
            claim = plan.claim if plan is not None else None
            if claim is None:
                raise DispatchError(f"fusion made node {node.name!r} ({node.op}) that the backend no longer "
                                    "resolves to one kernel", where=f"graph {legal.graph.name!r}",
                                    fix="report this; RLX_FUSION=0 compiles without fusion")
            origins = list(dict.fromkeys(legal.assignments[m].origin for m in members))
            a = legal.assignments[members[-1]]
            assignments[node.name] = Assignment(claim, a.origin, a.path)
            legal.extra.setdefault("fused_origins", {})[node.name] = origins
        else:
            assignments[node.name] = legal.assignments[node.name]
    out = Legalized(fused_graph, assignments, legal.plans, legal.outputs, legal.backend, legal.device,
                    dict(legal.extra))
    out.extra["kernels"] = _kernels_by_origin(out)
    return out


def _kernels_by_origin(legal: Legalized) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    fo = legal.extra.get("fused_origins", {})
    for name, a in legal.assignments.items():
        for origin in fo.get(name, [a.origin]):
            by.setdefault(origin, []).append(a.claim.name)
    return by


def _records() -> Any:
    from . import records

    return records


def _check_carry(graph: Graph, carry: Mapping[str, str]) -> dict[str, str]:
    ins = {v.name: v.type for v in graph.inputs}
    for i, o in carry.items():
        if i not in ins or o not in graph.outputs or ins[i] != graph.types[o]:
            raise InputError(f"cannot carry output {o!r} into input {i!r}", where=f"graph {graph.name!r}",
                             fix="pair each graph input with a graph output of the same type")
    return dict(carry)


#: (compiled program, its lock, (public name, value) per output, specialisation key, index inputs
#: with their extents)
_RunPlan = tuple[Any, threading.Lock, tuple[tuple[str, str], ...], tuple[tuple[str, int], ...],
                 tuple[tuple[str, int], ...]]


class Executable:
    """A compiled graph. ``run`` takes NumPy arrays by input name and returns outputs by name.

    Symbolic dims are specialised per distinct input-shape signature on first run and cached, the
    ``session.max_specializations`` most recently used ones at most (older ones are recompiled when
    their shapes come back). ``run`` is thread-safe: each specialisation runs under its own lock.
    """

    def __init__(self, session: Session, graph: Graph, *, carry: Mapping[str, str] | None = None) -> None:
        self.session = session
        self.graph = graph
        self.carry = _check_carry(graph, carry or {})
        self.backend = session.backend
        self.device = session.device
        self.report: DispatchReport | None = None
        self._specs = _SpecCache(getattr(session, "max_specializations", DEFAULT_MAX_SPECIALIZATIONS))
        self._lock = threading.Lock()
        self._binder = InputBinder(graph)
        #: Run plans by the inputs' shapes (graph input order): what a run needs once its inputs
        #: pass the checks that stay per call (a plain C-contiguous ndarray of the graph's dtype,
        #: by identity), so it skips binding, the symbol bindings and the specialisation lookup.
        #: The shapes alone decide whether the full check passes (symbols and expressions are
        #: functions of them), so a plan is made only after the full check passed for them. Each
        #: plan's specialisation is still in ``_specs`` (evicting it drops the plan: its memory
        #: is freed); index-checked graphs get none (their check depends on the values).
        self._plans: dict[tuple[tuple[int, ...], ...], _RunPlan] = {}
        self._fast_inputs = tuple((v.name, v.type.dtype.np) for v in graph.inputs)
        self._lru = bool(graph.symbols)  # several specialisations: hits refresh their place
        self._where = f"graph {graph.name!r} on {self.device.name}"

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.graph.outputs

    def program(self, bindings: Mapping[str, int] | None = None) -> Program:
        return self._specialise(dict(bindings or {}))[1]

    def _specialise(self, bindings: dict[str, int]) -> tuple[Any, Program, threading.Lock]:
        key = tuple(sorted(bindings.items()))
        with self._lock:
            hit = self._specs.get_recent(key)
            if hit is not None:
                return hit
            g = self.graph.specialize(bindings) if self.graph.symbols else self.graph
            if self.graph.symbols:  # extents that were symbolic at compile time are known now
                check_constant_indices(g)
            legal, cached = self.session.legalize(g)
            program = lower(legal, self.device, self.carry)
            compiled = self.backend.compile(program, self.device)
            self.report = self.session.report_for(legal, program, bindings, cached)
            entry = (compiled, program, threading.Lock())
            if self._specs.put(key, entry):  # evicted: so are the plans running it
                self._plans = {k: p for k, p in self._plans.items() if p[3] in self._specs}
            return entry

    def _plan(self, arrays: Mapping[str, np.ndarray], bindings: dict[str, int]) -> _RunPlan:
        """The specialisation for inputs that passed the full check, kept as the run plan of
        their shapes."""
        compiled, program, lock = self._specialise(bindings)
        key = tuple(sorted(bindings.items()))
        plan = (compiled, lock, tuple(program.outputs), key, index_bounds(self.graph, bindings))
        shapes = tuple(arrays[n].shape for n, _ in self._fast_inputs)
        with self._lock:
            if key in self._specs:  # not evicted by another thread meanwhile
                self._plans[shapes] = plan
        return plan

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        if kw or type(inputs) is not dict:
            feed = dict(inputs or {})
            feed.update(kw)
        else:
            feed = inputs  # only read: the backend gets it as the inputs by name
        where = self._where
        plan = None
        if len(feed) == len(self._fast_inputs):  # with every name present: no extra input
            shapes = []
            for name, dt in self._fast_inputs:
                a = feed.get(name)
                if type(a) is not np.ndarray or a.dtype is not dt or not a.flags.c_contiguous:
                    break
                shapes.append(a.shape)
            else:
                plan = self._plans.get(tuple(shapes))
        if plan is None:
            arrays, bindings = self._binder.bind(feed, where)
            plan = self._plan(arrays, bindings)
        else:
            arrays = feed
            # Shapes known, values new: index inputs are checked every run (the full check only
            # to name the bad one).
            if plan[4] and not inputs_in_range(feed, plan[4]):
                check_index_inputs(self.graph, feed, dict(plan[3]), where)
            if self._lru:  # a hit keeps its specialisation the most recently used
                try:
                    self._specs.move_to_end(plan[3])
                except KeyError:  # evicted by another thread just now: this run still has it
                    pass
        compiled, lock, outputs = plan[0], plan[1], plan[2]
        with lock:
            try:
                raw = compiled.run(arrays)
            except InputError as e:  # a backend's device-side check (an index computed on device)
                raise InputError(e.what, where=e.where or where, fix=e.fix) from e
            # A backend bug, even sys.exit, must name the backend, not surface raw or end the process.
            # KeyboardInterrupt is left alone: telling the user's Ctrl-C from a plugin's own costs a
            # signal-handler swap (~10 us) that this hot path does not pay; hooks and imports do.
            except (Exception, SystemExit) as e:
                raise PluginError(
                    f"the program compiled by {self.backend.label} raised {type(e).__name__}: {e}",
                    where=where, kind="runtime",
                    fix="this is a bug in the backend plugin; report it with the graph, or run on "
                        "another device") from e
        if len(outputs) == 1:  # a dict display: a comprehension costs ~0.3 us more (its frame)
            pub, val = outputs[0]
            return {pub: raw[val]}
        return {pub: raw[val] for pub, val in outputs}

    def buffers(self, bindings: Mapping[str, int] | None = None) -> BufferBinding:
        """The compiled program of this specialisation as a :class:`~rlx_core.records.BufferBinding`
        (its values addressed by name, runs without copies): what resident training drives.
        Raises :class:`CapabilityError` naming the backend when its programs lack the capability.
        The caller owns the program from here: ``run`` on this executable would share its buffers."""
        compiled = self._specialise(dict(bindings or {}))[0]
        if not isinstance(compiled, BufferBinding):
            missing = [m for m in ("buffer", "bind_input", "run_bound")
                       if not callable(getattr(compiled, m, None))]
            raise CapabilityError(
                f"the programs compiled by {self.backend.label} do not declare the buffer-binding "
                f"capability (rlx_core.plugin.BufferBinding; missing: {', '.join(missing) or 'run'})",
                where=f"graph {self.graph.name!r} on {self.device.name}",
                fix="use Executable.run, or a device whose backend has it (cpu)")
        return compiled

    def profile(self, inputs: Mapping[str, Any] | None = None, **kw: Any
                ) -> tuple[dict[str, np.ndarray], dict[str, int] | None]:
        """Run once and count kernel invocations by claim name (``None`` if the backend's compiled
        program has no ``profile``). The conformance suite uses it to check that every ``native``
        line of the report really ran the backend's kernel."""
        feed = dict(inputs or {})
        feed.update(kw)
        arrays, bindings = bind_inputs(self.graph, feed, f"graph {self.graph.name!r}")
        compiled, program, lock = self._specialise(bindings)
        prof = getattr(compiled, "profile", None)
        if prof is None:
            return self.run(feed), None
        with lock:
            raw, counts = prof(arrays)
        return {pub: raw[val] for pub, val in program.outputs}, dict(counts)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        """Positional call in input order; returns one array or a tuple of arrays."""
        feed = {v.name: a for v, a in zip(self.graph.inputs, args)}
        feed.update(kw)
        out = self.run(feed)
        vals = tuple(out[o] for o in self.graph.outputs)
        return vals[0] if len(vals) == 1 else vals


__all__ = ["BackendNotFoundError", "Executable", "Session", "Transfer", "__version__", "bind_inputs"]
