"""rlx-cpu's native max_pool2d (rlx_cpu.pooling): one Numba pass over planes split on the row pool,
checked against the float64 reference with NaN and infinities, odd strides and asymmetric pads."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

# (shape, kernel, strides, pads (t, l, b, r))
CASES = [
    ((2, 3, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1)),  # ResNet's stem pool
    ((1, 2, 7, 9), (2, 3), (1, 2), (1, 0, 0, 2)),      # asymmetric pads and strides
    ((3, 1, 5, 5), (5, 5), None, (0, 0, 0, 0)),        # one window a plane
    ((1, 4, 6, 11), (3, 2), (3, 1), (2, 1, 1, 0)),     # stride larger than the pad
]


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads"), CASES)
@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_max_pool2d_matches_reference(shape: tuple, kernel: tuple, strides: tuple | None, pads: tuple,
                                      dt: str, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import parallel

    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(threads))
    monkeypatch.setattr(parallel, "MIN_ELEMS_PER_THREAD", 1)  # split even the small cases
    g = GraphBuilder("mp")
    x = g.input("x", dt, shape)
    g.output(g.op("max_pool2d", x, kernel=kernel, strides=strides, pads=pads), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    assert "cpu.max_pool2d" in exe.report.to_text()
    rng = np.random.default_rng(5)
    for _ in range(2):
        xv = rng.standard_normal(shape)
        flat = xv.reshape(-1)
        flat[rng.integers(0, flat.size, 1 + flat.size // 50)] = np.nan  # NaN wins, as numpy's max
        flat[rng.integers(0, flat.size, 1 + flat.size // 50)] = np.inf
        flat[rng.integers(0, flat.size, 1 + flat.size // 50)] = -np.inf
        got = exe.run(x=xv.astype(np.float32 if dt == "f32" else np.float64))["y"]
        want = evaluate(graph, {"x": xv})["y"]
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        assert np.isnan(got).any()
