"""rlx-cpu's native kernels for the indexing HIR ops ``scatter_reduce`` and ``topk_indices``: NumPy's
unbuffered ``ufunc.at`` and a stable sort, instead of the core's dense O(updates * axis) and O(n^2)
decompositions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, device_error, normalize_axis

_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def k_scatter_reduce(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    x, idx, upd = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    red = str(attrs["reduction"])
    n = x.shape[ax]
    grids: list[Any] = list(np.indices(idx.shape, sparse=True))

    def run() -> None:
        np.copyto(o, x)
        if not idx.size:
            return
        # ONNX ScatterElements: [-n, n-1], negatives once from the end; checked before any update.
        if int(idx.min()) < -n or int(idx.max()) >= n:
            raise device_error("scatter_reduce", idx, n, ax)
        g = list(grids)
        g[ax] = np.where(idx < 0, idx + n, idx)
        at = tuple(np.broadcast_arrays(*g))
        with np.errstate(all="ignore"):
            if red == "none":
                # The last of duplicate targets wins, as ONNX Runtime's sequential loop.
                flat = np.ravel_multi_index(at, o.shape).reshape(-1)
                _, last = np.unique(flat[::-1], return_index=True)
                keep = flat.size - 1 - last
                o.reshape(-1)[flat[keep]] = upd.reshape(-1)[keep]
            else:
                _AT[red].at(o, at, upd)
    return run


def k_topk_indices(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    (x,) = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    k, largest = int(attrs["k"]), bool(attrs["largest"])  # type: ignore[arg-type]

    def run() -> None:
        xm = np.moveaxis(x, ax, -1)
        if x.dtype.kind == "f":
            # NaN is the largest value; among equal values the lower position comes first (stable).
            key = np.where(np.isnan(xm), np.inf, xm).astype(np.float64)
            nan = np.isnan(xm)
            order = np.lexsort((-key, ~nan), axis=-1) if largest else np.lexsort((key, nan), axis=-1)
        else:
            # ~x is decreasing in x for signed and unsigned integers alike, and never overflows.
            order = np.argsort(np.invert(xm) if largest else xm, axis=-1, kind="stable")
        np.copyto(o, np.moveaxis(order[..., :k], -1, ax))
    return run
