"""Post-training calibration: run the float graph on sample inputs and record every value's range.

Methods (per tensor):

* ``maxabs``: the largest magnitude seen, ``[-m, m]`` (``[0, m]`` for a tensor that was never
  negative, e.g. after ReLU): nothing seen is ever clipped.
* ``percentile``: the ``p``-th and ``(100 - p)``-th percentiles (default ``p = 99.99``): rare
  outliers are clipped so the common values get finer steps.
* ``minmax``: the smallest and largest values seen.

The graph is evaluated with the float64 reference (:func:`rlx_core.ir.reference.evaluate`, values
rounded to their float32 storage), or with a :class:`~rlx_core.runtime.Session` if one is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph
from .schemes import QuantizationError

METHODS = ("maxabs", "percentile", "minmax")
#: Values kept per tensor for percentiles (a strided subsample beyond this).
MAX_SAMPLES = 4_000_000


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float


def _feeds(graph: Graph, calib: Any, batch_size: int) -> Iterable[dict[str, np.ndarray]]:
    """One feed, a list of feeds, or one feed split along axis 0 when the graph has symbols."""
    if isinstance(calib, Mapping):
        arrays = {k: np.asarray(v) for k, v in calib.items()}
        missing = [v.name for v in graph.inputs if v.name not in arrays]
        if missing:
            raise QuantizationError(f"calibration data lacks input(s) {missing}",
                                    fix="give one array per graph input, keyed by input name")
        if not graph.symbols:
            yield {v.name: arrays[v.name].astype(v.type.dtype.np) for v in graph.inputs}
            return
        n = min(arrays[v.name].shape[0] for v in graph.inputs)
        for i in range(0, n, batch_size):
            yield {v.name: arrays[v.name][i:i + batch_size].astype(v.type.dtype.np) for v in graph.inputs}
        return
    for feed in calib:
        yield {v.name: np.asarray(feed[v.name]).astype(v.type.dtype.np) for v in graph.inputs}


def collect(graph: Graph, calib: Any, *, batch_size: int = 256, session: Any = None
            ) -> dict[str, np.ndarray]:
    """Every floating value of ``graph`` (inputs and node outputs) over the calibration data, flat."""
    names = [v.name for v in graph.inputs if v.type.dtype.is_float]
    names += [o for n in graph.nodes for o in n.outputs if graph.types[o].dtype.is_float]
    if not names:
        raise QuantizationError("the graph has no floating-point values to calibrate", fix="nothing to do")
    probe = Graph(graph.name + "_calibration", graph.inputs, graph.params, graph.nodes, tuple(names),
                  dict(graph.weights))
    chunks: dict[str, list[np.ndarray]] = {n: [] for n in names}
    exe = session.compile(probe) if session is not None else None
    seen = 0
    for feed in _feeds(graph, calib, batch_size):
        if exe is not None:
            got = exe.run(feed)
        else:
            from ..ir.reference import evaluate

            with np.errstate(all="ignore"):
                got = evaluate(probe, feed)
        for n in names:
            chunks[n].append(np.asarray(got[n], np.float64).reshape(-1))
        seen += 1
    if not seen:
        raise QuantizationError("the calibration data is empty", fix="pass at least one sample")
    out = {}
    for n, parts in chunks.items():
        v = np.concatenate(parts)
        if v.size > MAX_SAMPLES:
            v = v[:: v.size // MAX_SAMPLES + 1]
        if not np.all(np.isfinite(v)):
            raise QuantizationError(f"value {n!r} is NaN or Inf on the calibration data",
                                    fix="calibrate with data the float model handles")
        out[n] = v
    return out


def ranges_from_values(values: Mapping[str, np.ndarray], *, method: str = "maxabs",
                       percentile: float = 99.99) -> dict[str, Range]:
    if method not in METHODS:
        raise QuantizationError(f"unknown calibration method {method!r}", fix=f"use one of {METHODS}")
    if not 50.0 < percentile <= 100.0:
        raise QuantizationError(f"percentile {percentile} is not in (50, 100]", fix="e.g. 99.99")
    out = {}
    for n, v in values.items():
        if v.size == 0:
            out[n] = Range(0.0, 0.0)
            continue
        lo, hi = float(v.min()), float(v.max())
        if method == "maxabs":
            m = max(abs(lo), abs(hi))
            out[n] = Range(0.0 if lo >= 0 else -m, m)
        elif method == "percentile":
            out[n] = Range(float(np.percentile(v, 100.0 - percentile)), float(np.percentile(v, percentile)))
        else:
            out[n] = Range(lo, hi)
    return out


def calibrate(graph: Graph, calib: Any, *, method: str = "maxabs", percentile: float = 99.99,
              batch_size: int = 256, session: Any = None) -> dict[str, Range]:
    """Ranges of every floating value of ``graph`` over ``calib``.

    ``calib`` is ``{input name: array}`` (split along axis 0 into batches of ``batch_size`` when the
    graph has symbolic dims; used whole otherwise) or an iterable of such feeds.
    """
    return ranges_from_values(collect(graph, calib, batch_size=batch_size, session=session),
                              method=method, percentile=percentile)
