"""What every executable shares, one device or several: input checking and binding, the bounded
cache of shape specialisations, and a dispatch plan's line in the report.

Below both :mod:`rlx_core.runtime` (single-device executables, the Session) and
:mod:`rlx_core.placement` (multi-device executables), so neither imports the other's internals.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import settings
from .dispatch import Plan
from .errors import InputError
from .ir import symexpr
from .ir.graph import Graph
from .ir.indices import check_inputs as check_index_inputs
from .report import ReportEntry

#: Specialisations kept per executable unless RLX_MAX_SPECIALIZATIONS or the Session says otherwise:
#: each holds a compiled program and its arena, so 60 batch sizes once grew a process by ~470 MiB.
DEFAULT_MAX_SPECIALIZATIONS: int = settings.MAX_SPECIALIZATIONS.default


class SpecCache(OrderedDict):
    """Compiled specialisations by input-shape key, least recently used first, at most ``limit``.

    An evicted entry is only dropped from the cache: a run already using it keeps its own reference
    (and lock), so eviction never disturbs a concurrent run."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def get_recent(self, key: Any) -> Any:
        hit = self.get(key)
        if hit is not None:
            self.move_to_end(key)
        return hit

    def put(self, key: Any, value: Any) -> bool:
        """Store ``value`` as the most recent; True when that evicted older entries."""
        self[key] = value
        self.move_to_end(key)
        evicted = False
        while len(self) > self.limit:
            self.popitem(last=False)
            evicted = True
        return evicted


def report_entry(node: str, plan: Plan, device: str, kernels: list[str] | None = None) -> ReportEntry:
    return ReportEntry(node, plan.variant.op, plan.variant.describe(), plan.kind, plan.via,
                       tuple(kernels if kernels is not None else plan.kernels()), device, plan.cost)


def bind_inputs(graph: Graph, inputs: Mapping[str, Any], where: str) -> tuple[dict[str, np.ndarray],
                                                                               dict[str, int]]:
    """Check names, dtypes and shapes; return contiguous arrays and the symbol bindings."""
    want = {v.name: v.type for v in graph.inputs}
    unknown = sorted(set(inputs) - set(want))
    if unknown:
        raise InputError(f"unknown input(s) {unknown}", where=where,
                         fix=f"the graph's inputs are: {', '.join(want) or 'none'}")
    missing = [n for n in want if n not in inputs]
    if missing:
        sig = ", ".join(f"{n}: {want[n]}" for n in missing)
        raise InputError(f"missing input(s) {sig}", where=where, fix="pass every graph input by name")
    arrays: dict[str, np.ndarray] = {}
    bindings: dict[str, int] = {}
    for name, t in want.items():
        a = np.asarray(inputs[name])
        if a.dtype != t.dtype.np:
            raise InputError(f"input {name!r} has dtype {a.dtype}, the graph expects {t.dtype}",
                             where=where, fix=f"convert it, e.g. x.astype(np.{t.dtype.np.name})")
        if a.ndim != t.rank:
            raise InputError(f"input {name!r} has shape {a.shape} (rank {a.ndim}), the graph expects "
                             f"{t} (rank {t.rank})", where=where, fix="reshape the input")
        for axis, (got, d) in enumerate(zip(a.shape, t.shape)):
            if isinstance(d, int):
                if got != d:
                    raise InputError(f"input {name!r} has shape {a.shape}, the graph expects {t} "
                                     f"(axis {axis}: {got} != {d})", where=where, fix="reshape the input")
            elif not d.isidentifier():
                continue  # an expression: checked below, once every plain symbol is bound
            elif bindings.setdefault(d, got) != got:
                raise InputError(f"symbol {d!r} is {bindings[d]} in one input but {got} in {name!r} "
                                 f"(axis {axis})", where=where, fix=f"give every {d!r} axis the same size")
        arrays[name] = a if a.flags.c_contiguous else np.ascontiguousarray(a)
    for name, t in want.items():
        for axis, d in enumerate(t.shape):
            if symexpr.is_expr(d):
                need = symexpr.evaluate(d, bindings)  # Graph guarantees its symbols are bound by now
                got = arrays[name].shape[axis]
                if got != need:
                    sizes = ", ".join(f"{s}={bindings[s]}" for s in sorted(symexpr.symbols(d)))
                    raise InputError(f"input {name!r} has shape {arrays[name].shape}, the graph expects {t}: "
                                     f"axis {axis} is {got} but {d} = {need} ({sizes})", where=where,
                                     fix=f"feed {name!r} with axis {axis} of size {need}, or inputs whose "
                                         f"sizes make {d} = {got}")
    # Index operands fed by graph inputs are range-checked here, once, for every backend (ONNX rules).
    check_index_inputs(graph, arrays, bindings, where)
    return arrays, bindings


class InputBinder:
    """:func:`bind_inputs` for one graph with its per-input facts computed once: the hot path of
    ``Executable.run`` (a small graph's whole run is a few microseconds of kernels). Anything off
    the common path (a missing, extra, mistyped or misshapen input) goes through
    :func:`bind_inputs`, which raises the full error."""

    def __init__(self, graph: Graph) -> None:
        from .ir.indices import index_checks

        self.graph = graph
        self.names = frozenset(v.name for v in graph.inputs)
        self.specs = [(v.name, v.type.dtype.np, v.type.rank, tuple(v.type.shape),
                       all(isinstance(d, int) for d in v.type.shape)) for v in graph.inputs]
        self.index_checks = bool(index_checks(graph))
        #: (input, axis, expression): axes checked after the plain symbols are bound
        self.exprs = [(v.name, axis, d) for v in graph.inputs for axis, d in enumerate(v.type.shape)
                      if symexpr.is_expr(d)]

    def bind(self, inputs: Mapping[str, Any], where: str) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        if inputs.keys() != self.names:
            return bind_inputs(self.graph, inputs, where)
        arrays: dict[str, np.ndarray] = {}
        bindings: dict[str, int] = {}
        for name, npdt, rank, shape, static in self.specs:
            a = inputs[name]
            if type(a) is not np.ndarray:
                a = np.asarray(a)
            if a.dtype != npdt or a.ndim != rank:
                return bind_inputs(self.graph, inputs, where)
            if static:
                if a.shape != shape:
                    return bind_inputs(self.graph, inputs, where)
            else:
                for got, d in zip(a.shape, shape):
                    if isinstance(d, int):
                        if got != d:
                            return bind_inputs(self.graph, inputs, where)
                    elif d.isidentifier() and bindings.setdefault(d, got) != got:
                        return bind_inputs(self.graph, inputs, where)
            arrays[name] = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        for name, axis, d in self.exprs:
            if arrays[name].shape[axis] != symexpr.evaluate(d, bindings):
                return bind_inputs(self.graph, inputs, where)
        if self.index_checks:
            check_index_inputs(self.graph, arrays, bindings, where)
        return arrays, bindings
