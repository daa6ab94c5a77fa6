"""rlx-cpu's kernels for the bounded ops of ``rlx_core.ir.ops.bounded``: ``nonzero`` (NumPy's
``nonzero`` written into the padded result) and ``non_max_suppression`` (the candidate order sorted
by NumPy for every (batch, class) at once, then the sequential suppression loop in Numba,
:mod:`rlx_cpu._bounded_nb`). Both fill the unused slots with -1 and write the count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, DType, KernelClaim

from .kernels import Run


def k_nonzero(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x = ins[0]
    idx, count = outs

    def run() -> None:
        idx.fill(-1)
        if x.ndim == 0:
            count[...] = 1 if x != 0 else 0
            return
        coords = np.nonzero(x)
        k = coords[0].size
        for r, c in enumerate(coords):
            idx[r, :k] = c
        count[...] = k
    return run


def k_nms(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    from ._bounded_nb import nms

    boxes, scores, iou, sth = ins
    sel, count = outs
    a: Any = dict(attrs)
    center = int(a["center_point_box"])
    limit = max(int(a["max_output_boxes_per_class"]), 0)
    filtered = bool(attrs["has_score_threshold"])

    def run() -> None:
        sel.fill(-1)
        if sel.shape[0] == 0:
            count[...] = 0
            return
        s = np.ascontiguousarray(scores, np.float32)
        # descending score, ties by the lower box index (a stable sort of the negated scores;
        # NaN last), as rlx_core's reference orders the candidates
        order = np.argsort(-s, axis=-1, kind="stable")
        if filtered:
            keep = np.take_along_axis(s, order, -1) > np.float32(sth.reshape(-1)[0])
            # the candidates over the threshold, still in score order, first in each row
            order = np.take_along_axis(order, np.argsort(~keep, axis=-1, kind="stable"), -1)
            ncand = keep.sum(-1)
        else:
            ncand = np.full(s.shape[:2], s.shape[2], np.int64)
        count[...] = nms(np.ascontiguousarray(boxes, np.float32), np.ascontiguousarray(order, np.int64),
                         ncand.astype(np.int64), center, np.float32(iou.reshape(-1)[0]), limit, sel)
    return run


FACTORIES: dict[str, Any] = {"cpu.nonzero": k_nonzero, "cpu.non_max_suppression": k_nms}


def claims() -> list[KernelClaim]:
    """``nonzero`` on every dtype rlx-cpu stores; ``non_max_suppression`` on f32 (ONNX's only type)."""
    from rlx_core.plugin import REGISTRY

    return [KernelClaim("nonzero", "cpu.nonzero", dtypes=frozenset(REGISTRY.get("nonzero").dtypes),
                        out_dtypes=frozenset({DType.I64})),
            KernelClaim("non_max_suppression", "cpu.non_max_suppression", dtypes=frozenset({DType.F32}),
                        out_dtypes=frozenset({DType.I64}))]
