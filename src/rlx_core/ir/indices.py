"""One rule for index operands (``gather`` indices, ``embedding`` ids, ``scatter_add`` indices), and
the host-side checks that enforce it.

The rule is ONNX's: along an axis of size ``n`` an index ``i`` is valid in ``[-n, n - 1]``; a
negative index counts from the end once (``i + n``); anything outside is an error. Ops declare
their index operands with :class:`~rlx_core.ir.schema.IndexInput` (``OpSchema.index_inputs``), so
the checks live here once instead of in every backend:

* the float64 references call :func:`normalize` (InputError on a bad index);
* :func:`check_constants` rejects a constant (parameter) index out of range when a graph is
  compiled (IRError: the graph itself is invalid);
* :func:`check_inputs` rejects a graph input out of range before every run (InputError), with one
  vectorised min/max per index operand.

Indices computed on the device cannot be checked here: each backend's kernel bounds-checks them
(out of range gives 0 / skips the update, or raises where a device-side flag is cheap), so no
kernel ever reads or writes outside its buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, IRError
from .schema import REGISTRY, IndexInput
from .types import normalize_axis

if TYPE_CHECKING:  # graph.py is not imported at run time: the op references import this module
    from .graph import Graph, Node

#: Ops whose output holds exactly the values of their (first) input, rearranged: an index operand
#: produced by a chain of these from a graph input or a constant is checked at that source.
_VALUE_PRESERVING = frozenset({"reshape", "transpose"})
_CACHE_KEY = "_rlx_index_checks"


@dataclass(frozen=True)
class IndexCheck:
    """Index operand ``operand`` of ``node`` comes (unchanged) from ``source``, a graph input or a
    parameter; it indexes an axis of size ``extent`` (an int, or a symbol bound at run time)."""

    node: str
    op: str
    operand: str
    source: str
    axis: int
    extent: int | str


def fix_text(n: int) -> str:
    return (f"indices must be in [{-n}, {n - 1}] (ONNX: a negative index counts once from the end); "
            "clip or correct them before the run")


def _first_bad(idx: np.ndarray, n: int) -> tuple[int, tuple[int, ...]] | None:
    bad = (idx < -n) | (idx >= n)
    if not bad.any():
        return None
    pos = tuple(int(p) for p in np.unravel_index(int(np.argmax(bad)), idx.shape))
    return int(idx[pos]), pos


def _message(what: str, value: int, pos: tuple[int, ...], n: int, axis: int) -> str:
    return (f"{what}: index {value} at position {pos} is out of range for axis {axis} of size {n} "
            f"(valid: {-n} .. {n - 1})")


def normalize(idx: Any, n: int, *, what: str, axis: int = 0) -> np.ndarray:
    """``idx`` as int64 with negative indices counted from the end once; raises :class:`InputError`
    (naming ``what``, the value, its position and the valid range) for any index outside
    ``[-n, n - 1]``. The references of every index-taking op use this, so it *is* the semantics."""
    a = np.asarray(idx).astype(np.int64)
    if a.size:
        hit = _first_bad(a, n)
        if hit is not None:
            raise InputError(_message(what, hit[0], hit[1], n, axis), fix=fix_text(n))
    return np.where(a < 0, a + n, a)


def device_error(op: str, idx: Any, n: int, axis: int = 0) -> InputError:
    """The error a backend raises when its kernel finds an index out of range that no host check
    could see (computed on the device): names the op, the first bad value and its position.
    ``Executable.run`` adds the graph and device; the node is not known inside a kernel."""
    a = np.asarray(idx).astype(np.int64)
    hit = _first_bad(a, n) if a.size else None
    value, pos = hit if hit is not None else ("?", ())
    return InputError(f"{op}: an index computed on the device is out of range: index {value} at "
                      f"position {pos} of axis {axis} of size {n} (valid: {-n} .. {n - 1})",
                      fix=fix_text(n) + "; the indices come from an earlier node of the graph")


def _source(graph: Graph, value: str) -> str:
    """Follow value-preserving ops back to the value they copy (a graph input, a parameter, or the
    first computed value)."""
    producers = graph.producers
    while value in producers and producers[value].op in _VALUE_PRESERVING:
        value = producers[value].inputs[0]
    return value


def _axis(spec: IndexInput, node: Node, rank: int) -> int:
    ax = node.attrs[spec.axis_attr] if spec.axis_attr else spec.axis
    return normalize_axis(int(ax), rank)  # type: ignore[arg-type]


def index_checks(graph: Graph) -> tuple[IndexCheck, ...]:
    """Every host-checkable index operand of ``graph`` (cached on the graph: graphs are frozen)."""
    hit = graph.__dict__.get(_CACHE_KEY)
    if hit is not None:
        return hit
    out = []
    for node in graph.nodes:
        schema = REGISTRY._ops.get(node.op)
        if schema is None or not schema.index_inputs:
            continue
        for spec in schema.index_inputs:
            if spec.input >= len(node.inputs) or spec.data >= len(node.inputs):
                continue
            dt = graph.types[node.inputs[spec.data]]
            ax = _axis(spec, node, dt.rank)
            out.append(IndexCheck(node.name, node.op, node.inputs[spec.input],
                                  _source(graph, node.inputs[spec.input]), ax, dt.shape[ax]))
    checks = tuple(out)
    graph.__dict__[_CACHE_KEY] = checks  # frozen dataclass: cache like functools.cached_property
    return checks


def _what(c: IndexCheck, graph: Graph, kind: str) -> str:
    via = f" (via {c.operand!r})" if c.source != c.operand else ""
    return f"node {c.node!r} ({c.op}) of graph {graph.name!r}, {kind} {c.source!r}{via}"


def check_constants(graph: Graph, bindings: Mapping[str, int] | None = None) -> None:
    """Raise :class:`IRError` naming the node when a constant index operand is out of range (an
    extent still symbolic and unbound is checked when the graph is specialised)."""
    weights = graph.weights
    for c in index_checks(graph):
        if c.source not in weights:
            continue
        n = c.extent if isinstance(c.extent, int) else (bindings or {}).get(c.extent)
        if n is None:
            continue
        idx = np.asarray(weights[c.source])
        if idx.size and idx.dtype.kind in "iu":
            hit = _first_bad(idx.astype(np.int64), n)
            if hit is not None:
                raise IRError(_message(_what(c, graph, "constant indices"), hit[0], hit[1], n, c.axis),
                              where=f"node {c.node!r} (op {c.op})", fix=fix_text(n))


def input_bounds(graph: Graph, bindings: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """(graph input, extent) for every index operand fed by a graph input under ``bindings``,
    each pair once: what :func:`inputs_in_range` checks on a run whose shapes are known."""
    names = {v.name for v in graph.inputs}
    out: dict[tuple[str, int], None] = {}
    for c in index_checks(graph):
        n = c.extent if isinstance(c.extent, int) else bindings.get(c.extent)
        if c.source in names and n is not None:
            out[(c.source, n)] = None
    return tuple(out)


def inputs_in_range(arrays: Mapping[str, np.ndarray], bounds: tuple[tuple[str, int], ...]) -> bool:
    """Whether every index input is in range (:func:`check_inputs` says which is not). Token ids
    are short: below 64 values one ``tolist`` and Python's min/max cost less than NumPy's two
    reductions (7 ids: 3.36 -> 1.04 us for the whole check, ``bench/cpu_call_overhead.py``)."""
    for name, n in bounds:
        a = arrays[name]
        if a.size <= 64:
            if a.size:
                v = a.ravel().tolist()
                if min(v) < -n or max(v) >= n:
                    return False
        elif int(a.min()) < -n or int(a.max()) >= n:
            return False
    return True


def check_inputs(graph: Graph, arrays: Mapping[str, np.ndarray], bindings: Mapping[str, int],
                 where: str) -> None:
    """Raise :class:`InputError` when an index operand fed by a graph input is out of range: one
    ``min``/``max`` per operand, then (only on failure) the first bad value and its position."""
    for c in index_checks(graph):
        a = arrays.get(c.source)
        if a is None or a.size == 0:
            continue
        n = c.extent if isinstance(c.extent, int) else bindings.get(c.extent)
        if n is None:
            continue
        if int(a.min()) >= -n and int(a.max()) < n:
            continue
        hit = _first_bad(a.astype(np.int64), n)
        assert hit is not None
        raise InputError(_message(_what(c, graph, "index input"), hit[0], hit[1], n, c.axis),
                         where=f"{where}, node {c.node!r} (op {c.op})", fix=fix_text(n))


__all__ = ["IndexCheck", "check_constants", "check_inputs", "device_error", "fix_text", "index_checks",
           "input_bounds", "inputs_in_range", "normalize"]
