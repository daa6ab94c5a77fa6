"""The Numba suppression loop of ``non_max_suppression`` (see :mod:`rlx_cpu.bounded`), compiled on
first use and cached next to this file (or in NUMBA_CACHE_DIR).

It repeats ``rlx_core``'s reference (``rlx_core.ir.ops.bounded``, itself onnx.reference's
``suppress_by_iou``) operation for operation in float32: no fastmath (no contraction into fused
multiply-adds), Python's ``max``/``min`` tie and NaN rules, the same early exits. A box whose IoU
lies on the threshold is then kept or suppressed exactly as ONNX decides.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _suppress(bb, i, j, center, thr):
    """True when candidate box ``i`` overlaps kept box ``j`` by more than ``thr`` (IoU, float32)."""
    two = np.float32(2.0)
    if center == 0:
        a, b = bb[i, 1], bb[i, 3]
        x1_min, x1_max = (b, a) if a >= b else (a, b)
        a, b = bb[j, 1], bb[j, 3]
        x2_min, x2_max = (b, a) if a >= b else (a, b)
        ix_min = x2_min if x2_min > x1_min else x1_min
        ix_max = x2_max if x2_max < x1_max else x1_max
        if ix_max <= ix_min:
            return False
        a, b = bb[i, 0], bb[i, 2]
        y1_min, y1_max = (b, a) if a >= b else (a, b)
        a, b = bb[j, 0], bb[j, 2]
        y2_min, y2_max = (b, a) if a >= b else (a, b)
        iy_min = y2_min if y2_min > y1_min else y1_min
        iy_max = y2_max if y2_max < y1_max else y1_max
        if iy_max <= iy_min:
            return False
    else:
        w1 = bb[i, 2] / two
        h1 = bb[i, 3] / two
        w2 = bb[j, 2] / two
        h2 = bb[j, 3] / two
        x1_min = bb[i, 0] - w1
        x1_max = bb[i, 0] + w1
        x2_min = bb[j, 0] - w2
        x2_max = bb[j, 0] + w2
        ix_min = x2_min if x2_min > x1_min else x1_min
        ix_max = x2_max if x2_max < x1_max else x1_max
        if ix_max <= ix_min:
            return False
        y1_min = bb[i, 1] - h1
        y1_max = bb[i, 1] + h1
        y2_min = bb[j, 1] - h2
        y2_max = bb[j, 1] + h2
        iy_min = y2_min if y2_min > y1_min else y1_min
        iy_max = y2_max if y2_max < y1_max else y1_max
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
    return inter / union > thr


@njit(cache=True, nogil=True)
def nms(boxes, order, ncand, center, thr, max_per_class, out):
    """Greedy suppression over ``order[b, c, :ncand[b, c]]`` (candidates by descending score);
    writes (batch, class, box) rows into ``out`` and returns how many."""
    nb, nc = order.shape[0], order.shape[1]
    kept = np.empty(order.shape[2], np.int64)
    count = 0
    for b in range(nb):
        bb = boxes[b]
        for c in range(nc):
            nk = 0
            for t in range(ncand[b, c]):
                if nk >= max_per_class:
                    break
                i = order[b, c, t]
                keep = True
                for q in range(nk):
                    if _suppress(bb, i, kept[q], center, thr):
                        keep = False
                        break
                if keep:
                    kept[nk] = i
                    nk += 1
                    out[count, 0] = b
                    out[count, 1] = c
                    out[count, 2] = i
                    count += 1
    return count
