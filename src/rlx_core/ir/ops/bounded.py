"""Bounded ops: data-dependent results in a static upper-bound shape plus a count.

``nonzero`` and ``non_max_suppression`` have outputs whose *size* depends on the data (ONNX's
``NonZero`` and ``NonMaxSuppression``). One RLX graph has static shapes, so these ops return what
detection runtimes return (TensorRT's EfficientNMS, padded NMS in TF/XLA): the result padded to the
largest size it can have, with ``-1`` in the unused slots, and an ``int64`` scalar ``count`` of the
valid entries. A consumer (staged ONNX execution, :mod:`rlx_core.frontends.onnx_staged`) trims the
padded result to ``count`` on the host; everything up to and including the op runs on the backend.

* ``nonzero(x) -> (indices, count)``: ``indices`` is ``[rank, numel]`` int64, its first ``count``
  columns the coordinates of the nonzero elements in row-major order (NumPy's ``np.nonzero``;
  NaN counts as nonzero, ``-0.0`` as zero), then ``-1``.
* ``non_max_suppression(boxes [B, N, 4], scores [B, C, N], iou_threshold, score_threshold) ->
  (selected, count)``: ``selected`` is ``[B * C * min(N, max_output_boxes_per_class), 3]`` int64 rows
  ``(batch, class, box)`` in ONNX's order (per batch, per class, by descending score, ties by the
  lower box index), then rows of ``-1``.

Neither has a decomposition into the other ops (a sort plus a sequential suppression loop, or a
prefix count scattered into place, have no static-shape MIR form worth having), so each is a
primitive: a backend that does not claim it fails to compile it with a ``DispatchError`` naming
the op, and the staged ONNX path then keeps the host op (explicit in ``describe()``).

**Why the NMS reference computes in float32.** ONNX defines NonMaxSuppression on ``float`` boxes, and
both ONNX's reference and ONNX Runtime compute the IoU in float32; a box whose IoU with a selected
one lies on the threshold is kept or suppressed by that float32 arithmetic. The float64 oracle would
decide some of those boundary cases the other way, so this reference evaluates every intermediate
in float32, exactly as ``onnx.reference`` does (same operations in the same order, Python's
``max``/``min`` semantics included), and selects the same indices bit for bit. NaN scores have no
order in ONNX (its comparator is not a strict weak order then); here they sort after every number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...dtypes import FLOAT_DTYPES, INT_DTYPES, WIDE_UINT_DTYPES, DType
from ...errors import ShapeError
from .. import symexpr
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType
from ._common import check_dtypes

#: Every dtype with a NumPy counterpart: NonZero takes any tensor.
NONZERO_DTYPES = tuple(FLOAT_DTYPES) + tuple(INT_DTYPES) + WIDE_UINT_DTYPES + (DType.BOOL,)
#: The pad value of the unused slots of a bounded result.
PAD = -1


# -- nonzero ---------------------------------------------------------------------------------------

def _infer_nonzero(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("nonzero", ts, NONZERO_DTYPES)
    shape = ts[0].shape
    numel: Any = symexpr.prod(shape) if any(isinstance(d, str) for d in shape) else \
        math.prod(int(d) for d in shape)
    return [TensorType(DType.I64, (len(shape), numel)), TensorType(DType.I64, ())]


def nonzero_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(indices [rank, numel] padded with -1, count)``: the bounded form of ONNX NonZero."""
    x = np.asarray(x)
    out = np.full((x.ndim, x.size), PAD, np.int64)
    if x.ndim == 0:  # ONNX: a scalar's result has no rows; the count says whether it is nonzero
        return out, np.array(int(np.count_nonzero(x)), np.int64)
    coords = np.nonzero(x)
    k = int(coords[0].size)
    for r, c in enumerate(coords):
        out[r, :k] = c
    return out, np.array(k, np.int64)


register_op(OpSchema(
    "nonzero", ("x",), _infer_nonzero, lambda xs, at: list(nonzero_reference(xs[0])),
    num_outputs=2, category="indexing", dtypes=NONZERO_DTYPES, differentiable=False, accuracy="exact",
    cases=CaseSpec("bounded"),
    doc="coordinates of the nonzero elements, [rank, numel] int64 padded with -1, and their count "
        "(ONNX NonZero in a static shape)"))


# -- non_max_suppression ---------------------------------------------------------------------------

def _int(attrs: Mapping[str, Any], name: str, default: int = 0) -> int:
    v: Any = attrs.get(name, default)
    return int(v)


def _static(op: str, t: TensorType, what: str) -> tuple[int, ...]:
    if any(isinstance(d, str) for d in t.shape):
        raise ShapeError(f"op {op!r}: {what} has the symbolic shape {t.shape}; the bound of the result "
                         f"needs static sizes", fix="bind the symbols (specialise the graph) first")
    return tuple(int(d) for d in t.shape)


def nms_bound(boxes: Sequence[int], scores: Sequence[int], max_per_class: int) -> int:
    """Rows of the padded result: B * C * min(N, max_output_boxes_per_class)."""
    return int(boxes[0]) * int(scores[1]) * min(int(boxes[1]), max(int(max_per_class), 0))


def _infer_nms(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("non_max_suppression", ts, (DType.F32,))
    b = _static("non_max_suppression", ts[0], "boxes")
    s = _static("non_max_suppression", ts[1], "scores")
    if len(b) != 3 or b[2] != 4 or len(s) != 3 or s[0] != b[0] or s[2] != b[1]:
        raise ShapeError(f"op 'non_max_suppression': boxes {list(b)} and scores {list(s)} are not "
                         f"[B, N, 4] and [B, C, N]", fix="pass boxes [batch, boxes, 4], scores "
                                                        "[batch, classes, boxes]")
    for i, name in ((2, "iou_threshold"), (3, "score_threshold")):
        if _static("non_max_suppression", ts[i], name) not in ((), (1,)):
            raise ShapeError(f"op 'non_max_suppression': {name} has shape {list(ts[i].shape)}",
                             fix=f"pass {name} as a scalar ([] or [1])")
    if _int(attrs, "max_output_boxes_per_class") < 0:
        raise ShapeError("op 'non_max_suppression': max_output_boxes_per_class is negative",
                         fix="clamp it to 0 (ONNX's meaning of a negative count)")
    rows = nms_bound(b, s, _int(attrs, "max_output_boxes_per_class"))
    return [TensorType(DType.I64, (rows, 3)), TensorType(DType.I64, ())]


def _pmax(a: Any, b: Any) -> Any:
    return b if b > a else a  # Python's max(a, b), which onnx.reference uses (NaN: keeps a)


def _pmin(a: Any, b: Any) -> Any:
    return b if b < a else a


def _minmax(lhs: Any, rhs: Any) -> tuple[Any, Any]:
    return (rhs, lhs) if lhs >= rhs else (lhs, rhs)


def _suppress(b1: np.ndarray, b2: np.ndarray, center: int, thr: np.float32) -> bool:
    """onnx.reference's suppress_by_iou, every step in float32 (``b1``: the candidate)."""
    two = np.float32(2)
    if center == 0:  # [y1, x1, y2, x2], corners in either order
        x1_min, x1_max = _minmax(b1[1], b1[3])
        x2_min, x2_max = _minmax(b2[1], b2[3])
        ix_min, ix_max = _pmax(x1_min, x2_min), _pmin(x1_max, x2_max)
        if ix_max <= ix_min:
            return False
        y1_min, y1_max = _minmax(b1[0], b1[2])
        y2_min, y2_max = _minmax(b2[0], b2[2])
        iy_min, iy_max = _pmax(y1_min, y2_min), _pmin(y1_max, y2_max)
        if iy_max <= iy_min:
            return False
    else:  # [x_center, y_center, width, height]
        w1, h1, w2, h2 = b1[2] / two, b1[3] / two, b2[2] / two, b2[3] / two
        x1_min, x1_max, x2_min, x2_max = b1[0] - w1, b1[0] + w1, b2[0] - w2, b2[0] + w2
        ix_min, ix_max = _pmax(x1_min, x2_min), _pmin(x1_max, x2_max)
        if ix_max <= ix_min:
            return False
        y1_min, y1_max, y2_min, y2_max = b1[1] - h1, b1[1] + h1, b2[1] - h2, b2[1] + h2
        iy_min, iy_max = _pmax(y1_min, y2_min), _pmin(y1_max, y2_max)
        if iy_max <= iy_min:
            return False
    inter = (ix_max - ix_min) * (iy_max - iy_min)
    if inter <= 0:
        return False
    a1 = (x1_max - x1_min) * (y1_max - y1_min)
    a2 = (x2_max - x2_min) * (y2_max - y2_min)
    union = a1 + a2 - inter
    if a1 <= 0 or a2 <= 0 or union <= 0:
        return False
    return bool(inter / union > thr)


def nms_order(scores: np.ndarray, score_threshold: np.float32 | None) -> np.ndarray:
    """Candidate box indices of one (batch, class): over the threshold (when given), by descending
    score, ties by the lower index (ONNX's BoxInfo order); NaN scores last."""
    cand = np.arange(scores.shape[0]) if score_threshold is None else np.nonzero(scores > score_threshold)[0]
    return cand[np.argsort(-scores[cand], kind="stable")]


def nms_reference(boxes: np.ndarray, scores: np.ndarray, iou_threshold: Any, score_threshold: Any,
                  max_per_class: int, center_point_box: int, has_score_threshold: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(selected [B*C*min(N, max), 3] padded with -1, count)``: ONNX NonMaxSuppression in float32."""
    boxes = np.asarray(boxes).astype(np.float32)
    scores = np.asarray(scores).astype(np.float32)
    thr = np.float32(np.asarray(iou_threshold).reshape(-1)[0])
    sth = np.float32(np.asarray(score_threshold).reshape(-1)[0]) if has_score_threshold else None
    nb = boxes.shape[0]
    nc = scores.shape[1]
    m = max(int(max_per_class), 0)
    out = np.full((nms_bound(boxes.shape, scores.shape, m), 3), PAD, np.int64)
    count = 0
    for b in range(nb):
        bb = boxes[b]
        for c in range(nc):
            kept: list[int] = []
            for i in nms_order(scores[b, c], sth):
                if len(kept) >= m:
                    break
                if any(_suppress(bb[i], bb[j], center_point_box, thr) for j in kept):
                    continue
                kept.append(int(i))
                out[count] = (b, c, int(i))
                count += 1
    return out, np.array(count, np.int64)


def _ref_nms(xs: Sequence[Any], attrs: Attrs) -> list[np.ndarray]:
    return list(nms_reference(xs[0], xs[1], xs[2], xs[3], _int(attrs, "max_output_boxes_per_class"),
                              _int(attrs, "center_point_box"), bool(attrs.get("has_score_threshold", False))))


def _nms_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    # a sort per (batch, class) and up to one IoU (~20 operations) per candidate and kept box
    n = ins[1].numel()
    per_box = ins[0].shape[1]
    return float(n * 8 + outs[0].numel() // 3 * (per_box if isinstance(per_box, int) else 1) * 20)


register_op(OpSchema(
    "non_max_suppression", ("boxes", "scores", "iou_threshold", "score_threshold"), _infer_nms, _ref_nms,
    attrs=(AttrSpec("max_output_boxes_per_class", "int", doc="boxes kept per (batch, class) at most (>= 0): "
                    "the result has B*C*min(N, this) rows"),
           AttrSpec("center_point_box", "int", 0, "0: boxes are [y1, x1, y2, x2]; 1: [x_center, y_center, "
                    "width, height]", choices=(0, 1)),
           AttrSpec("has_score_threshold", "bool", False, "filter the candidates by score > score_threshold "
                    "(else the score_threshold operand is ignored)")),
    num_outputs=2, category="indexing", dtypes=(DType.F32,), differentiable=False, accuracy="exact",
    flops=_nms_flops, cases=CaseSpec("bounded"),
    doc="ONNX NonMaxSuppression: selected (batch, class, box) rows, [B*C*min(N, max), 3] int64 padded "
        "with -1, and their count"))
