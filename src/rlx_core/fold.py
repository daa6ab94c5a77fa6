"""Constant folding: the one pass that evaluates graph nodes whose inputs are all constants.

:func:`fold_constants` runs in :meth:`rlx_core.runtime.Session.legalize` before fusion and dispatch,
so every backend receives the folded graph (and the compile-cache key, the graph's fingerprint, is
taken of the folded graph). A node is folded when every input is a parameter (or an already folded
value), its op has a float64 reference, none of its outputs is a graph output (a backend computes
those, so an output is never a bare constant) and its result fits the :class:`FoldBudget`. It is
evaluated with the op's float64 reference and rounded to the node's declared dtype, exactly as
:func:`rlx_core.ir.reference.evaluate` does for every intermediate: integers and booleans are exact,
floats are the correctly rounded value of the float64 result.

The ONNX importer folds ONNX operators (not graph nodes) with onnx's reference evaluator under the
same :class:`FoldBudget` rules (:class:`rlx_core.frontends.onnx.FoldBudget` adds the ONNX specifics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .dtypes import reference_np_dtype
from .errors import RLXError
from .ir.graph import Graph, Value
from .ir.schema import REGISTRY


class FoldBudget:
    """How much constant folding one graph (or one ONNX import) may do (issue 14: a 158-byte file
    once took 43 s and 3.6 GB in ``rlx explain``).

    * A fold whose result has more elements than its largest input (it *amplifies*) may create at most
      ``max_elements`` elements; a fold that does not amplify (transpose, cast, slice of a weight) may
      be as large as its input.
    * All folds together may create at most ``max_bytes`` plus twice the bytes of the model's own
      tensors (so folding a transpose or cast of every weight still fits).
    * A fold may take at most ``16 * max_elements`` multiply-adds (:meth:`work`).

    A node over budget is not folded: it stays a node of the graph, computed at run time.
    """

    def __init__(self, max_elements: int, max_bytes: int, own_bytes: int) -> None:
        self.max_elements = max_elements
        self.max_bytes = max_bytes
        self.left = max_bytes + 2 * own_bytes

    @classmethod
    def for_graph(cls, graph: Graph, max_elements: int | None = None,
                  max_bytes: int | None = None) -> FoldBudget:
        """The budget of compiling ``graph``: ``RLX_ONNX_FOLD_MAX_ELEMENTS`` / ``RLX_ONNX_FOLD_MAX_BYTES``
        (defaults 16M elements / 64 MiB) unless given."""
        from .settings import ONNX_FOLD_MAX_BYTES, ONNX_FOLD_MAX_ELEMENTS

        own = sum(int(np.asarray(graph.weights[p.name]).nbytes) for p in graph.params)
        return cls(int(ONNX_FOLD_MAX_ELEMENTS.get() if max_elements is None else max_elements),
                   int(ONNX_FOLD_MAX_BYTES.get() if max_bytes is None else max_bytes), own)

    def data_bounded(self, op: str) -> bool:
        """Whether ``op``'s result, of unknown size, is at most its inputs' (times their rank)."""
        return False

    def work(self, op: str, shapes: Sequence[tuple[int, ...]], out_elems: int) -> int | None:
        """Multiply-adds of folding ``op`` (None: not counted)."""
        return None

    def check(self, op: str, inputs: Sequence[np.ndarray], outs: list[tuple[int, int]] | None,
              work: int | None = None) -> str | None:
        """Why a fold of ``op`` would be over budget (None: it may fold). ``outs``: the predicted
        ``(elements, itemsize)`` of each output, None when they cannot be known beforehand;
        ``work``: its multiply-adds if known (else :meth:`work` is asked)."""
        biggest = max((a.size for a in inputs), default=0)
        if outs is None:
            if not self.data_bounded(op):
                return "the size of its result cannot be known before computing it"
            rank = max((a.ndim for a in inputs), default=1)
            outs = [(biggest * max(rank, 1), 8)]
        elems = sum(n for n, _ in outs)
        nbytes = sum(n * size for n, size in outs)
        if max((n for n, _ in outs), default=0) > biggest and elems > self.max_elements:
            return (f"folding it would create {elems:,} elements from inputs of at most {biggest:,} (over "
                    f"the limit of {self.max_elements:,} elements, RLX_ONNX_FOLD_MAX_ELEMENTS)")
        if nbytes > self.left:
            return (f"folding it would create {nbytes:,} bytes, more than the {max(self.left, 0):,} bytes "
                    f"left of the folding budget (RLX_ONNX_FOLD_MAX_BYTES)")
        if work is None:
            work = self.work(op, [a.shape for a in inputs], elems)
        if work is not None and work > 16 * self.max_elements:
            return (f"folding it would take about {work:,} multiply-adds (over the limit of "
                    f"{16 * self.max_elements:,})")
        return None

    def charge(self, nbytes: int) -> None:
        self.left -= int(nbytes)


def _concrete(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in shape)


def constant_values(graph: Graph, budget: FoldBudget | None = None, *, outputs: bool = False
                    ) -> tuple[dict[str, np.ndarray], list[str]]:
    """The weights plus the value (in its declared dtype) of every foldable node's outputs, and the
    names of the folded nodes in graph order. ``budget=None``: no limit; ``outputs``: graph outputs
    may be folded too (a caller that only reads the values)."""
    consts: dict[str, np.ndarray] = {p.name: np.asarray(graph.weights[p.name]) for p in graph.params}
    keep = set() if outputs else set(graph.outputs)
    folded: list[str] = []
    for n in graph.nodes:
        if not n.inputs or not all(i in consts for i in n.inputs) or any(o in keep for o in n.outputs):
            continue
        types = [graph.types[o] for o in n.outputs]
        if not all(_concrete(t.shape) for t in types):
            continue
        schema = REGISTRY.get(n.op, where=n.where)
        ins = [consts[i] for i in n.inputs]
        if budget is not None:
            outs = [(math.prod(int(d) for d in t.shape), int(t.dtype.np.itemsize)) for t in types]
            try:
                work = int(schema.flops([graph.types[i] for i in n.inputs], types, n.attrs))
            except Exception:
                work = None
            if budget.check(n.op, ins, outs, work) is not None:
                continue
        args = [a.astype(reference_np_dtype(graph.types[i].dtype)) for a, i in zip(ins, n.inputs)]
        try:
            with np.errstate(all="ignore"):
                res = schema.reference(args, n.attrs)
                vals = []
                for t, v in zip(types, res):
                    v = np.asarray(v)
                    if t.dtype.is_complex and v.dtype.kind != "c":
                        v = v.astype(np.complex128)
                    vals.append(v.astype(t.dtype.np, order="C"))  # (0-d stays 0-d)
        except (RLXError, ValueError, TypeError, ArithmeticError, IndexError):
            continue  # left to run time (which reports an error the way it always does)
        if len(vals) != len(types) or any(v.shape != t.shape for v, t in zip(vals, types)):
            continue
        for o, v in zip(n.outputs, vals):
            v.flags.writeable = False
            consts[o] = v
        if budget is not None:
            budget.charge(sum(v.nbytes for v in vals))
        folded.append(n.name)
    return consts, folded


def fold_constants(graph: Graph, budget: FoldBudget | None = None) -> Graph:
    """``graph`` with every foldable node replaced by a parameter holding its value (named as the
    value it computed); parameters no longer read are dropped. ``budget`` defaults to
    :meth:`FoldBudget.for_graph`. Returns ``graph`` itself when nothing folds."""
    if budget is None:
        budget = FoldBudget.for_graph(graph)
    consts, folded = constant_values(graph, budget)
    if not folded:
        return graph
    gone = set(folded)
    nodes = [n for n in graph.nodes if n.name not in gone]
    used = {i for n in nodes for i in n.inputs} | set(graph.outputs)
    params = [p for p in graph.params if p.name in used]
    params += [Value(o, graph.types[o]) for n in graph.nodes if n.name in gone
               for o in n.outputs if o in used]
    weights: Mapping[str, Any] = {p.name: consts[p.name] for p in params}
    return Graph(graph.name, graph.inputs, tuple(params), tuple(nodes), graph.outputs, weights)
