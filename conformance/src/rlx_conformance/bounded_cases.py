"""Conformance cases for the bounded ops (``rlx_core.ir.ops.bounded``: ``nonzero``,
``non_max_suppression``): the ``"bounded"`` family of :data:`rlx_conformance.cases.GENERATORS`. Few
cases (every plugin that claims them runs them), chosen where a shortcut goes wrong: for ``nonzero``
half zeros (``-0.0`` among them, which is zero, and NaN, which is not), a scalar, an empty tensor,
a non-contiguous view; for ``non_max_suppression`` boxes on a grid of halves and quantized scores,
so ties in score (the lower box index first) and IoUs exactly on the threshold (not suppressed:
ONNX suppresses above it) occur, both box encodings, a score threshold, a per-class limit below
the box count, and no boxes at all. Results are indices and counts, compared exactly, padding
included (-1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]


def _sparse(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """About half zeros; floats also get -0.0 (zero) and NaN/Inf (nonzero)."""
    if dt == DType.BOOL:
        return rng.random(shape) < 0.5
    if dt.is_float:
        vals = np.array([0.0, 0.0, -0.0, 1.5, -2.0, np.nan, np.inf, 0.25])
    else:
        vals = np.array([0, 0, 0, 1, 2, 7] + ([-1, -3] if np.iinfo(dt.np).min < 0 else []))
    return rng.choice(vals, size=shape).astype(dt.np)


def _grid_boxes(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Box coordinates on a grid of halves (corners in either order): exact IoUs, boundary cases."""
    return (rng.integers(0, 6, size=shape) * 0.5).astype(np.float32)


def _center_boxes(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """[x_center, y_center, width, height] with positive sizes, on a grid of halves."""
    b = rng.integers(0, 6, size=shape) * 0.5
    b[..., 2:] = rng.integers(1, 5, size=(*shape[:-1], 2))
    return b.astype(np.float32)


def _scores(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Quarter steps in [0, 1]: many exact ties."""
    return (rng.integers(0, 5, size=shape) / 4).astype(np.float32)


def _value(v: float) -> Any:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return np.full(shape, v, np.float32)
    return make


def gen_bounded(c: Any) -> None:
    if c.op == "nonzero":
        c.add("basic", "basic", [("x", c.arr(_sparse, (3, 5)))])
        c.add("rank3", "basic", [("x", c.arr(_sparse, (2, 3, 4)))])
        c.add("noncontiguous", "noncontiguous", [("x", c.arr(_sparse, (4, 3), nc=True))])
        c.add("scalar", "scalar", [("x", c.arr(_sparse, ()))])
        c.add("size0", "size0", [("x", c.arr(_sparse, (0, 3)))])
        return

    def nms(label: str, kind: str, b: int, cl: int, n: int, attrs: dict[str, Any], iou: float = 0.5,
            sth: float = 0.0, center: bool = False) -> None:
        c.add(label, kind, [("boxes", c.arr(_center_boxes if center else _grid_boxes, (b, n, 4))),
                            ("scores", c.arr(_scores, (b, cl, n))), ("iou_threshold", c.arr(_value(iou), ())),
                            ("score_threshold", c.arr(_value(sth), ()))], attrs)

    nms("basic", "basic", 2, 3, 10, {"max_output_boxes_per_class": 10})
    nms("limit", "basic", 1, 2, 12, {"max_output_boxes_per_class": 3}, iou=0.25)
    nms("iou_zero", "basic", 1, 1, 9, {"max_output_boxes_per_class": 9}, iou=0.0)
    nms("score_threshold", "basic", 2, 2, 8,
        {"max_output_boxes_per_class": 8, "has_score_threshold": True}, sth=0.5)
    nms("center", "basic", 1, 2, 10, {"max_output_boxes_per_class": 10, "center_point_box": 1},
        iou=1 / 3, center=True)
    nms("max0", "size0", 1, 2, 5, {"max_output_boxes_per_class": 0})
    nms("size0", "size0", 2, 2, 0, {"max_output_boxes_per_class": 4})


GENERATORS = {"bounded": gen_bounded}
