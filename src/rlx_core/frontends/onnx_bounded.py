"""NonZero, NonMaxSuppression and Compress on the backend, as bounded ops (:mod:`rlx_core.ir.ops.bounded`).

Their output shape depends on the data, so one RLX graph cannot hold them; staged execution
(:mod:`rlx_core.frontends.onnx_staged`) cuts the ONNX graph after such a node. Where the session's
backend runs the bounded IR op (``nonzero``, ``non_max_suppression``: the result padded to its upper
bound plus a count), the node runs *in* the stage before the cut, on the backend, and the cut only
trims the padded result to ``count`` (a slice on the host of a result the backend computed). Where
it does not, the node stays a host op (onnx.reference on the host between stages), as before.

How the importer knows: :class:`~rlx_core.frontends.onnx_staged.StagedModel` sets a *checker*
(:func:`bounded_by`) for its imports; the checker asks the session's dispatcher, through the public
``Session.check``, whether the fragment the node becomes (the bounded op, for Compress with the
``gather`` of the kept positions), with the node's actual input types, has a legal path on the
backend. The default-domain handler (``onnx_staged._host_op``) calls :func:`boundary` first: it
raises :class:`BoundedShapeError` (a :class:`DataDependentShapeError`) when the backend takes the op,
and staging then replaces the node in the stage before the cut by a node of the private domain
:data:`DOMAIN` whose two outputs (padded result, count) this module translates to the IR op.
``load_onnx`` outside staged execution sets no checker, so it raises the plain error, as before.

Compress with a run-time condition is ``nonzero(condition)`` then a ``gather`` of the kept positions:
its padded result gathers position 0 in the padding slots, and the cut keeps the first ``count``
slices along the axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from ..ir.types import TensorType
from .onnx import DataDependentShapeError, _Const, _Importer, register_handler

#: The private ONNX domain of the replacement nodes staging inserts (never in a user's model).
DOMAIN = "ai.rlx.bounded"
#: ONNX operator -> the bounded RLX op that computes it.
BOUNDED_OPS: Mapping[str, str] = {"NonZero": "nonzero", "NonMaxSuppression": "non_max_suppression",
                                  "Compress": "nonzero"}
#: Suffixes of the replacement node's outputs (the original output name + suffix).
PADDED, COUNT = "::rlx_padded", "::rlx_count"

#: ``emit(builder, operands, attrs) -> [padded, count]``: the fragment an ONNX node becomes.
Emit = Callable[[Any, Sequence[Tensor], Mapping[str, Any]], list[Tensor]]
#: ``checker(op_type, operand types, attrs, emit) -> bool``: does the backend run that fragment.
Checker = Callable[[str, Sequence[TensorType], Mapping[str, Any], Emit], bool]
_CHECKER: ContextVar[Checker | None] = ContextVar("rlx_onnx_bounded_checker", default=None)


@contextmanager
def bounded_by(checker: Checker | None) -> Iterator[None]:
    """Imports inside the block may emit bounded ops where ``checker`` says the backend runs them."""
    token = _CHECKER.set(checker)
    try:
        yield
    finally:
        _CHECKER.reset(token)


class BoundedShapeError(DataDependentShapeError):
    """A data-dependent node the session's backend runs as the bounded RLX op ``op``: staging computes
    it before the cut and trims its padded result there (:mod:`rlx_core.frontends.onnx_bounded`)."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None, node: str = "",
                 outputs: Sequence[str] = (), op: str = "") -> None:
        super().__init__(what, where=where, fix=fix, node=node, outputs=outputs)
        self.op = op


def _max_boxes(imp: _Importer, v: Any) -> int | None:
    """ONNX's max_output_boxes_per_class: 0 when absent, clamped at 0; None when computed at run time."""
    if v is None:
        return 0
    if isinstance(v, _Const):
        arr = v.array.reshape(-1)
        return max(int(arr[0]), 0) if arr.size else 0
    return None


def _nms_types(imp: _Importer, ins: Sequence[Any]) -> list[TensorType] | None:
    """The IR operands' types, or None where the bounded op cannot take the node (not float32, or
    symbolic sizes: the bound needs static ones)."""
    types = [imp.t(ins[0]).type, imp.t(ins[1]).type]
    if any(t.dtype is not DType.F32 or any(isinstance(d, str) for d in t.shape) for t in types):
        return None
    for v in ins[3:5]:
        if v is not None and (getattr(v, "dtype", None) not in (None, DType.F32)
                              or (isinstance(v, _Const) and v.array.dtype != np.float32)):
            return None
    return types + [TensorType(DType.F32, ()), TensorType(DType.F32, ())]


def boundary(imp: _Importer, node: Any, ins: Sequence[Any], attrs: Mapping[str, Any]) -> None:
    """Raise :class:`BoundedShapeError` when the import's checker says the backend runs ``node`` as a
    bounded op; return (nothing) when it does not, or when no checker is set (plain ``load_onnx``)."""
    checker = _CHECKER.get()
    op = BOUNDED_OPS.get(node.op_type)
    if checker is None or op is None:
        return
    limit: int | None = 0
    if node.op_type == "NonZero":
        types = [imp.t(ins[0]).type]
        op_attrs: dict[str, Any] = {}
    elif node.op_type == "Compress":
        found = _compress_operands(imp, ins, attrs)
        if found is None:
            return
        types, op_attrs = found
    else:
        nms_types = _nms_types(imp, ins)
        if nms_types is None:
            return
        types = nms_types
        limit = _max_boxes(imp, ins[2] if len(ins) > 2 else None)
        n = int(types[0].shape[1])
        op_attrs = {"max_output_boxes_per_class": n if limit is None else limit,
                    "center_point_box": 1 if attrs.get("center_point_box", 0) else 0,
                    "has_score_threshold": len(ins) > 4 and ins[4] is not None}
    if not checker(node.op_type, types, op_attrs, EMIT[node.op_type]):
        return
    if limit is None:
        # The count bounds the padded result: like a shape value, it is computed first and compiled in.
        raise imp.needs_values([ins[2]], "NonMaxSuppression's max_output_boxes_per_class bounds the size of "
                                         "its result and is computed at run time")
    label = node.name or node.op_type
    raise BoundedShapeError(
        f"{node.op_type} has a data-dependent output shape; the backend runs it as the bounded op {op!r} "
        f"(its result padded to the upper bound, with a count)", where=imp.node_where,
        fix="compile it with staged execution (rlx_core.frontends.onnx.load_onnx_model): the stage before "
            "the cut computes it on the backend and the cut trims it to the count",
        node=label, outputs=[o for o in node.output], op=op)


def replacement(node: Any) -> Any:
    """The private-domain node computing ``node``'s padded result and count (same inputs, attributes)."""
    from onnx import NodeProto

    out = NodeProto()
    out.CopyFrom(node)
    out.domain = DOMAIN
    del out.output[:]
    out.output.extend([node.output[0] + PADDED, node.output[0] + COUNT])
    out.name = (node.name or node.op_type) + "/bounded"
    return out


def trim(node: Any, padded: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The ONNX result: the first ``count`` columns (NonZero), rows (NonMaxSuppression) or slices
    along the axis (Compress; the flattened input's only axis without one)."""
    k = int(np.asarray(count).reshape(()))
    axis = 0
    if node.op_type == "NonZero":
        axis = 1
    elif node.op_type == "Compress":
        from onnx import helper

        given = [helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"]
        axis = int(given[0]) % padded.ndim if given else 0
    return np.ascontiguousarray(padded[(slice(None),) * axis + (slice(0, k),)])


def _scalar_f32(imp: _Importer, v: Any, default: float) -> Tensor:
    if v is None:
        return imp.g.const(np.float32(default), DType.F32)
    t = imp.t(v, DType.F32)
    return t if t.shape == () else imp.g.op("reshape", t, shape=())


def _compress_operands(imp: _Importer, ins: Sequence[Any], attrs: Mapping[str, Any]
                       ) -> tuple[list[TensorType], dict[str, Any]] | None:
    """Compress's operand types and the normalised axis (None: flattened), or None where the bounded
    form does not apply (symbolic sizes; a condition longer than the axis, which ONNX leaves
    undefined and onnx.reference refuses: the host op reports it)."""
    x, cond = imp.t(ins[0]), imp.t(ins[1])
    if cond.dtype is not DType.BOOL or len(cond.shape) != 1 or \
            any(isinstance(d, str) for d in (*x.shape, *cond.shape)):
        return None
    axis = attrs.get("axis")
    if axis is not None and not -len(x.shape) <= int(axis) < len(x.shape):
        return None
    ax = None if axis is None else int(axis) % len(x.shape)
    size = math.prod(int(d) for d in x.shape) if ax is None else int(x.shape[ax])
    if int(cond.shape[0]) > size:
        return None
    return [x.type, cond.type], {"axis": ax}


def _emit_nonzero(g: Any, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    return list(g.op("nonzero", ins[0]))


def _emit_nms(g: Any, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    return list(g.op("non_max_suppression", *ins, **attrs))


def _emit_compress(g: Any, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, cond = ins
    ax = attrs["axis"]
    if ax is None:
        x = g.op("reshape", x, shape=(math.prod(int(d) for d in x.shape),))
        ax = 0
    n = int(cond.shape[0])
    idx, count = g.op("nonzero", cond)
    # the padding slots (-1) gather position 0; the cut drops them (n <= the axis size, so 0 exists
    # whenever a slot does)
    pos = g.op("maximum", g.op("reshape", idx, shape=(n,)), g.const(0, DType.I64))
    return [g.op("gather", x, pos, axis=ax), count]


#: The fragment each ONNX operator becomes (what the checker asks the backend about, and emits).
EMIT: Mapping[str, Emit] = {"NonZero": _emit_nonzero, "NonMaxSuppression": _emit_nms,
                            "Compress": _emit_compress}


def _nonzero(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return _emit_nonzero(imp.g, [imp.t(ins[0])], {})


def _compress(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    found = _compress_operands(imp, ins, attrs)
    if found is None:  # pragma: no cover - boundary() checked the same before choosing this path
        raise imp.unsupported("Compress: no bounded form for these operands", fix="run it as a host op")
    return _emit_compress(imp.g, [imp.t(ins[0]), imp.t(ins[1])], found[1])


def _nms(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    limit = _max_boxes(imp, ins[2] if len(ins) > 2 else None)
    if limit is None:
        raise imp.needs_values([ins[2]], "NonMaxSuppression's max_output_boxes_per_class bounds the size of "
                                         "its result and is computed at run time")
    has = len(ins) > 4 and ins[4] is not None
    operands = [imp.t(ins[0]), imp.t(ins[1]), _scalar_f32(imp, ins[3] if len(ins) > 3 else None, 0.0),
                _scalar_f32(imp, ins[4] if has else None, 0.0)]
    return _emit_nms(imp.g, operands, {"max_output_boxes_per_class": limit,
                                       "center_point_box": 1 if attrs.get("center_point_box", 0) else 0,
                                       "has_score_threshold": has})


register_handler("NonZero", _nonzero, domain=DOMAIN)
register_handler("NonMaxSuppression", _nms, domain=DOMAIN)
register_handler("Compress", _compress, domain=DOMAIN)

__all__ = ["BOUNDED_OPS", "DOMAIN", "BoundedShapeError", "bounded_by", "boundary", "replacement", "trim"]
