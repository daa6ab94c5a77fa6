"""rlx-cpu's general-path linear with few rows and >= 4M multiply-adds (a CNN's classifier at batch
8) calls oneDNN through ctypes, not the Numba kernel: equal to a float64 reference, row pieces split
over the pool, and nothing loads Numba; ``CTYPES_ROWS = 0`` restores the Numba kernel."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session


def _classifier(rows: int, k: int = 512, n: int = 1000) -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(8)
    g = GraphBuilder("fc")
    x = g.input("x", "f32", (rows, k))
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    g.output(g.op("linear", x, g.param("w", w), g.param("b", b)), "y")
    xv = rng.standard_normal((rows, k)).astype(np.float32)
    xv[0, 3] = np.nan  # a NaN input poisons its row, as in the reference
    ref = xv.astype(np.float64) @ w.T.astype(np.float64) + b
    return g.build(), {"x": xv}, ref


@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("ctypes_rows", [16, 0])
@pytest.mark.parametrize("threads", [1, 2])
def test_few_row_linear_matches_float64(rows: int, ctypes_rows: int, threads: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import hir_kernels, parallel

    monkeypatch.setenv("RLX_CPU_DENSE", "0")  # the general path (an MLP-only program binds in dense)
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(threads))
    monkeypatch.setattr(hir_kernels, "CTYPES_ROWS", ctypes_rows)
    graph, feed, ref = _classifier(rows)
    y = Session("cpu", use_cache=False).compile(graph).run(feed)["y"]
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)
    assert np.isnan(y[0]).all() and not np.isnan(y[1:]).any()


_CHILD = """
import json, sys
sys.path[:0] = [{here!r}]
import numpy as np
from test_cpu_linear_ctypes import _classifier
from rlx_core import Session
graph, feed, ref = _classifier(8)
y = Session("cpu", use_cache=False).compile(graph).run(feed)["y"]
print(json.dumps({{"mods": sorted(m for m in ("numba", "llvmlite") if m in sys.modules),
                  "err": float(np.nanmax(np.abs(y[1:] - ref[1:])))}}))
"""


def test_classifier_at_batch_8_loads_no_numba() -> None:
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "RLX_CPU_DENSE": "0", "RLX_CPU_THREADS": "2"}
    r = subprocess.run([sys.executable, "-c", _CHILD.format(here=here)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["mods"] == [], got
    assert got["err"] < 1e-4, got


@pytest.mark.parametrize("rows", [1, 8, 16, 17])
def test_few_row_classifier_runs_on_the_team_where_onednn_is_loaded(rows: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to TEAM_ROWS rows, a program that loaded oneDNN (a CNN) runs its classifier as the team's
    matmul primitive (weights packed once): equal to float64, the same bits on one thread or two;
    one more row takes the row pieces."""
    from rlx_cpu import blas, hir_kernels, onednn_conv, parallel

    from rlx_core.runtime import bind_inputs

    if not onednn_conv.available():
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
    assert hir_kernels.TEAM_ROWS == 16
    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)  # the test sets the load
    monkeypatch.setenv("RLX_CPU_DENSE", "0")
    graph, feed, ref = _classifier(rows)
    probe = np.ones((2, 4), np.float32)
    assert blas.dnnl_gemm_fn(probe, np.ones((4, 4), np.float32), np.empty((2, 4), np.float32)) is not None
    assert blas.dnnl_loaded()  # as after a program of convs
    exe = Session("cpu", use_cache=False).compile(graph)
    outs = []
    for active in (2, 1, 2):
        pool.active = active
        y = exe.run(feed)["y"].copy()
        np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)
        assert np.isnan(y[0]).all() and not np.isnan(y[1:]).any()
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    (run,) = exe._specialise(bind_inputs(graph, feed, "test")[1])[0].runs
    assert hasattr(run, "team") == (rows <= 16), type(run)
