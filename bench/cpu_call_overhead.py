"""Per-call cost of rlx-cpu's small data-movement kernels against the NumPy call each used to make,
in one process: the figures docs/BENCHMARKS.md quotes for 2026-12-03's per-call overhead work.

    python bench/cpu_call_overhead.py [--calls 20000] [--rounds 5]

Each row binds the kernel as rlx-cpu does (the factory on fixed arrays) and times it next to the
earlier form of the same step (written out here: np.copyto, np.concatenate, x.take, the float64
division, NumPy's reduce, the full index check); median over rounds of each burst's median, in
microseconds. Both sides must give the same bits (checked first). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np


def _rows() -> list[tuple[str, Callable[[], Any], Callable[[], Any], Callable[[], tuple[Any, Any]]]]:
    from rlx_cpu import kernels as k

    from rlx_core import GraphBuilder
    from rlx_core.ir.indices import check_inputs, input_bounds, inputs_in_range
    from rlx_core.plugin import Attrs

    rng = np.random.default_rng(0)
    rows: list[Any] = []

    x = rng.standard_normal((1, 7, 4, 8)).astype(np.float32)
    src = x.transpose(0, 2, 1, 3)
    o1, o2 = np.empty((1, 4, 7, 8), np.float32), np.empty((1, 4, 7, 8), np.float32)
    rows.append(("transpose (1,7,4,8) -> (1,4,7,8)", k.k_transpose([x], [o1], Attrs({"perm": (0, 2, 1, 3)})),
                 lambda: np.copyto(o2, src), lambda: (o1, o2)))

    past = rng.standard_normal((1, 4, 6, 8)).astype(np.float32)
    new = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    c1, c2 = np.empty((1, 4, 7, 8), np.float32), np.empty((1, 4, 7, 8), np.float32)
    rows.append(("concat KV cache (1,4,6,8)+(1,4,1,8)", k.k_concat([past, new], [c1], Attrs({"axis": 2})),
                 lambda: np.concatenate([past, new], axis=2, out=c2), lambda: (c1, c2)))

    qkv = rng.standard_normal((3, 1, 16, 32)).astype(np.float32)
    idx = np.array(1)
    idx.flags.writeable = False  # a constant of the program
    g1, g2 = np.empty((1, 16, 32), np.float32), np.empty((1, 16, 32), np.float32)
    rows.append(("gather constant index (3,1,16,32)[1]", k.k_gather([qkv, idx], [g1], Attrs({"axis": 0})),
                 lambda: qkv.take(idx, 0, g2), lambda: (g1, g2)))

    w = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    m1, m2 = np.empty((1, 1, 16, 16), np.float32), np.empty((1, 1, 16, 16), np.float32)
    mean = k.reduction(np.mean)([w], [m1], Attrs({"axes": (1,), "keepdims": True}))

    def mean_old() -> None:
        np.add.reduce(w, axis=(1,), out=m2, keepdims=True, dtype=np.float32)
        np.true_divide(m2, np.intp(4), out=m2, casting="unsafe")
    rows.append(("reduce_mean (1,4,16,16) over heads", mean, mean_old, lambda: (m1, m2)))

    p = rng.standard_normal((1, 960, 4, 4)).astype(np.float32)
    s1, s2 = np.empty((1, 960, 1, 1), np.float32), np.empty((1, 960, 1, 1), np.float32)
    pool = k.reduction(np.mean)([p], [s1], Attrs({"axes": (2, 3), "keepdims": True}))

    def pool_old() -> None:
        np.add.reduce(p, axis=(2, 3), out=s2, keepdims=True, dtype=np.float32)
        np.true_divide(s2, np.intp(16), out=s2, casting="unsafe")
    rows.append(("global mean (1,960,4,4)", pool, pool_old,
                 lambda: (np.round(s1, 5), np.round(s2, 5))))  # the product adds in another order

    from rlx_cpu import blas, hir_kernels

    if blas.onednn(np.float32) and blas.dnnl_loaded():  # the earlier path needs oneDNN loaded
        xl = rng.standard_normal((1, 32)).astype(np.float32)
        wl = rng.standard_normal((6, 32)).astype(np.float32)
        wl.flags.writeable = False
        bl = rng.standard_normal(6).astype(np.float32)
        l1, l2 = np.empty((1, 6), np.float32), np.empty((1, 6), np.float32)
        wt = np.ascontiguousarray(wl.T)
        saved, hir_kernels.NUMPY_GEMV_MAX = hir_kernels.NUMPY_GEMV_MAX, 0
        try:
            earlier = hir_kernels._one_thread_gemv(xl, wt, bl, l2)  # oneDNN's sgemm through ctypes
        finally:
            hir_kernels.NUMPY_GEMV_MAX = saved
        rows.append(("linear 32 -> 6, one row", hir_kernels.k_linear([xl, wl, bl], [l1], Attrs({})), earlier,
                     lambda: (np.round(l1, 4), np.round(l2, 4))))

    gb = GraphBuilder("ids")
    table = gb.param("table", rng.standard_normal((100, 8)).astype(np.float32))
    gb.output(gb.op("gather", table, gb.input("ids", "i64", (1, 7)), axis=0), "y")
    graph = gb.build()
    feed = {"ids": rng.integers(0, 100, (1, 7))}
    bounds = input_bounds(graph, {})
    rows.append(("index input check, 7 token ids", lambda: inputs_in_range(feed, bounds),
                 lambda: check_inputs(graph, feed, {}, "bench"), lambda: (0, 0)))
    rows += _classifier_rows(rng)
    rows += _mlp_rows()
    return rows


def _classifier_rows(rng: np.random.Generator) -> list[Any]:
    """A CNN's classifier at batch 8 in a program that loaded oneDNN: the linear as bound now (the
    team's matmul primitive, ``rlx_cpu.hir_kernels._team_linear``) against the row pieces of
    oneDNN's sgemm it ran as before (``_pool_linear``)."""
    from rlx_cpu import blas, hir_kernels

    from rlx_core.plugin import Attrs

    rows: list[Any] = []
    for m, k, n, what in ((8, 576, 1024, "mobilenet_v3_small"), (8, 512, 1000, "ResNet-18")):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        w.flags.writeable = False
        b = rng.standard_normal(n).astype(np.float32)
        b.flags.writeable = False
        o1, o2 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        wt = np.ascontiguousarray(w.T)
        wt.flags.writeable = False
        if blas.dnnl_gemm_fn(x, wt, o2) is None:  # also loads oneDNN, as a program of convs has
            continue
        earlier = hir_kernels._pool_linear(x, wt, b, o2)
        now = hir_kernels.k_linear([x, w, b], [o1], Attrs({}))
        rows.append((f"{what} classifier {m}x{k} -> {n}", now, earlier,
                     # the two sum in other orders: equal to float32 rounding of the magnitudes
                     lambda o1=o1, o2=o2: (np.allclose(o1, o2, rtol=1e-5, atol=2e-4), True)))
    return rows


def _mlp_rows() -> list[Any]:
    """The MLP 784-512-256-10 (``rlx bench infer mlp``), whole ``Executable.run``: its team runs as
    one run (``rlx_cpu.dense.merge_teams``) against one run each (the earlier form); the merged
    run as one call of the compiled dispatch loop (``rlx_cpu._dispatch``) against the Python loop
    of ctypes calls (``RLX_CPU_NATIVE_DISPATCH=0``), where the extension is built."""
    import os

    from rlx_cpu import dense, native, settings

    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session

    rows: list[Any] = []
    graph = rlx_graph("mlp")
    for batch in (1, 8):
        feed = inputs("mlp", batch, 1)
        merged = Session("cpu").compile(graph)
        merged.run(feed)  # compiled (bound) now, with the merge
        saved = dense.merge_teams
        dense.merge_teams = lambda r, n, c: (tuple(r), tuple(n), tuple(c))
        try:
            separate = Session("cpu").compile(graph)
            separate.run(feed)
        finally:
            dense.merge_teams = saved
        rows.append(_pair(f"MLP 784-512-256-10 batch {batch}, merged", merged, separate, feed))
        if native.why_not() is None:
            os.environ[settings.NATIVE_DISPATCH.name] = "0"
            try:
                python_loop = Session("cpu").compile(graph)
                python_loop.run(feed)
            finally:
                del os.environ[settings.NATIVE_DISPATCH.name]
            rows.append(_pair(f"MLP 784-512-256-10 batch {batch}, native", merged, python_loop, feed))
    return rows


def _pair(name: str, now_exe: Any, old_exe: Any, feed: dict[str, Any]) -> Any:
    got: dict[str, Any] = {}

    def now() -> None:
        got["now"] = now_exe.run(feed)["y"]

    def old() -> None:
        got["old"] = old_exe.run(feed)["y"]
    return (name, now, old, lambda: (got["now"], got["old"]))


def _interleaved(a: Callable[[], Any], b: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(p50 of ``a``, p50 of ``b``) in microseconds over ``calls`` alternating calls of each."""
    import time

    ta, tb = [], []
    clock = time.perf_counter_ns
    for i in range(calls):
        for f, ts in ((a, ta), (b, tb)) if i % 2 else ((b, tb), (a, ta)):
            t0 = clock()
            f()
            ts.append(clock() - t0)
    return statistics.median(ta) / 1e3, statistics.median(tb) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--mlp-calls", type=int, default=4000, help="calls a burst for the MLP rows")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from rlx_core.bench import measure

    print(f"{'step':40s} {'earlier us':>10s} {'now us':>8s}")
    for name, now, old, outs in _rows():
        now()
        old()
        got, want = outs()
        assert np.array_equal(np.asarray(got), np.asarray(want)), name
        t_old, t_now = [], []
        for _ in range(a.rounds):
            if name.startswith("MLP"):
                # Whole programs differ by ~2%, less than this VM's swing between bursts: calls
                # alternate one by one (each program's p50 over the same moments).
                o_, n_ = _interleaved(old, now, a.mlp_calls)
                t_old.append(o_)
                t_now.append(n_)
                continue
            t_old.append(statistics.median(measure(old, a.calls, 0.0, a.calls)) * 1e6)
            t_now.append(statistics.median(measure(now, a.calls, 0.0, a.calls)) * 1e6)
        print(f"{name:40s} {statistics.median(t_old):10.2f} {statistics.median(t_now):8.2f}", flush=True)


if __name__ == "__main__":
    main()
