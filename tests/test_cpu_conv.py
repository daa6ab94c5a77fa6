"""rlx-cpu conv2d: several convs of one program share one per-thread im2col scratch buffer."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(3)


# pooled: every conv of a batch of >= 2 images on rlx-cpu's BLAS over a 2-thread pool, whole
# images a thread, each with its own scratch (a batch of 1 is never pooled).
@pytest.mark.parametrize(("batch", "pooled"), [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_convs_sharing_scratch_match_reference(batch: int, pooled: bool, dt: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import conv, parallel

    monkeypatch.setattr(conv, "POOL_MIN_MACS", 0 if pooled else 1 << 62)
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    np_dt = np.float32 if dt == "f32" else np.float64
    g = GraphBuilder("convs")
    x = g.input("x", dt, (batch, 4, 9, 11))

    def w(o: int, i: int, k: int) -> object:
        return g.param(f"w{o}_{i}_{k}", RNG.standard_normal((o, i, k, k)).astype(np_dt))

    # No padding first (fills the scratch with data), then padded, strided, grouped and dilated
    # convs that must not see those bytes in their zero borders.
    a = g.op("conv2d", x, w(6, 4, 3), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    b = g.op("conv2d", a, w(6, 6, 3), strides=(2, 1), pads=(2, 1, 1, 2), dilations=(1, 1), groups=1)
    c = g.op("conv2d", b, w(6, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 2), groups=2)
    d = g.op("conv2d", c, w(5, 6, 1), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    g.output(d, "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    for _ in range(2):  # the second run reuses a scratch that already holds the last conv's bytes
        xv = RNG.standard_normal((batch, 4, 9, 11)).astype(np_dt)
        np.testing.assert_allclose(exe.run(x=xv)["y"], evaluate(graph, {"x": xv})["y"], rtol=1e-4, atol=1e-4)
