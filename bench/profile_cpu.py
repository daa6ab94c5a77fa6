"""Where rlx-cpu's time goes on a `rlx bench infer` workload, and the GEMM layouts it chooses between.

    python bench/profile_cpu.py minilm --batch 8            # per-kernel time (sum of per-step minima)
    python bench/profile_cpu.py --gemm                      # x @ W.T vs x @ W (C-contiguous) GFLOP/s
    python bench/profile_cpu.py --libs                      # one-core GEMM: oneDNN vs OpenBLAS
    python bench/profile_cpu.py minilm --batch 1 --chains   # row chains, barriers, arena by reuse distance
    python bench/profile_cpu.py --pool                      # cost of handing work to the other threads
    python bench/profile_cpu.py --zoo efficientnet_b0 --batch 1 --top 15   # an ONNX zoo export, step by step

Per-kernel times are the minimum over ``--reps`` runs of each step, summed by claim name: robust to
other processes on a small shared machine (a benchmark, not a test; docs/BENCHMARKS.md cites it).
Row chains are turned off (``RLX_CPU_CHAIN=0``) so that every kernel is a step of its own; with
``--chain`` a chain is one step, named after its kernels.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import numpy as np


def _zoo_graph(name: str, batch: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A zoo model's ONNX export (cached as bench/onnx_zoo.py caches it) and its feeds."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests"))
    import _zoo

    from rlx_core.frontends.onnx import load_onnx

    path = _zoo.export(name, "legacy", False, root / ".pytest_cache" / "rlx-onnx-zoo", batch=batch)
    return load_onnx(path), _zoo.feeds(name, batch)


def profile(model: str, batch: int, seq: int, reps: int, chain: bool = False, zoo: str | None = None,
            top: int = 0) -> None:
    import os

    os.environ["RLX_CPU_CHAIN"] = "1" if chain else "0"
    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session, bind_inputs

    if zoo:
        graph, feed = _zoo_graph(zoo, batch)
        model = zoo
    else:
        graph, feed = rlx_graph(model), inputs(model, batch, seq)
    exe = Session("cpu").compile(graph)
    compiled, _, _ = exe._specialise(bind_inputs(graph, feed, "profile")[1])
    for _ in range(3):
        exe.run(feed)
    best = [float("inf")] * len(compiled.runs)
    for _ in range(reps):
        for name, view in compiled.inputs:
            np.copyto(view, feed[name])
        for i, r in enumerate(compiled.runs):
            t0 = time.perf_counter()
            r()
            best[i] = min(best[i], time.perf_counter() - t0)
    total: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    for kname, t in zip(compiled.kernel_names, best):
        total[kname] += t
        calls[kname] += 1
    print(f"{model} batch {batch}: sum of per-step minima {sum(best) * 1e3:.1f} ms over {reps} runs")
    for kname, t in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {t * 1e3:9.3f} ms  {calls[kname]:4d} calls  {kname}")
    if top:
        # The slowest single steps, with the step's output shapes (where the program records them).
        names = compiled.kernel_names
        print(f"slowest {top} steps:")
        for i in sorted(range(len(best)), key=lambda i: -best[i])[:top]:
            print(f"  {best[i] * 1e6:9.1f} us  step {i:4d}  {names[i]}  {_step_shape(compiled, i)}")


def _step_shape(compiled: Any, i: int) -> str:
    """The step's op and output shapes, where runs still map one-to-one onto the program's steps."""
    prog = compiled.program
    if len(compiled.runs) != len(prog.kernels):
        return ""
    step = prog.kernels[i]
    shapes = [tuple(prog.graph.types[v].shape) for v in step.outputs if v in prog.graph.types]
    return f"{step.op} -> {' '.join(map(str, shapes))}"


def gemm_layouts(reps: int) -> None:
    rng = np.random.default_rng(0)
    for m, k, n in [(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (1024, 384, 1536),
                    (1024, 1536, 384)]:
        x = rng.random((m, k), np.float32)
        w = rng.random((n, k), np.float32)
        wt = np.ascontiguousarray(w.T)
        o = np.empty((m, n), np.float32)
        operands = {"x @ W.T": w.T, "x @ W(in,out)": wt}
        best = dict.fromkeys(operands, float("inf"))
        for _ in range(reps):
            for name, b in operands.items():
                t0 = time.perf_counter()
                np.matmul(x, b, out=o)
                best[name] = min(best[name], time.perf_counter() - t0)
        print(f"{m}x{k}x{n}: " + "  ".join(f"{name} {2 * m * k * n / t / 1e9:.0f} GFLOP/s"
                                           for name, t in best.items()))


def _library_calls(m: int, k: int, n: int, rng: np.random.Generator) -> dict[str, object]:
    import ctypes

    from rlx_cpu import blas

    x = rng.random((m, k), np.float32)
    w = rng.random((k, n), np.float32)
    o = np.empty((m, n), np.float32)
    calls: dict[str, object] = {}
    native = blas.linear_rows(x, w, np.zeros(n, np.float32), o)
    if native is not None:
        fn, args = native
        calls["oneDNN (1 core)"] = lambda: fn(*args, 0, m)
    st = blas._load()
    if st["ok"]:
        sg = st["gemm"][np.dtype(np.float32)]
        px, pw, po = (ctypes.c_void_p(a.ctypes.data) for a in (x, w, o))
        calls["OpenBLAS (1 core)"] = lambda: sg(101, 111, 111, m, n, k, 1.0, px, k, pw, n, 0.0, po, n)
    calls["np.matmul (all cores)"] = lambda: np.matmul(x, w, out=o)  # also keeps x, w, o alive
    return calls


def gemm_libraries(reps: int) -> None:
    """One-core float32 GFLOP/s of the GEMM libraries rlx-cpu can use, on MiniLM's linear shapes
    (64 rows = batch 1 split over two threads), plus NumPy's threaded ``np.matmul`` for scale."""
    from rlx_cpu import blas

    rng = np.random.default_rng(0)
    print(f"float32 linears run on: {blas.library(np.float32)}")
    for m, k, n in [(64, 384, 384), (64, 384, 1536), (64, 1536, 384), (512, 384, 1536),
                    (512, 1536, 384)]:
        calls = _library_calls(m, k, n, rng)
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(reps):
            for name, f in calls.items():
                t0 = time.perf_counter()
                f()  # type: ignore[operator]
                best[name] = min(best[name], time.perf_counter() - t0)
        print(f"{m}x{k}x{n}: " + "  ".join(f"{name} {2 * m * k * n / t / 1e9:.0f} GFLOP/s"
                                           for name, t in best.items()))


def _bound(model: str, batch: int, seq: int, env: dict[str, str]) -> object:
    import os

    from rlx_core._hub import reset_hub
    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session, bind_inputs

    os.environ.update(env)
    reset_hub()  # devices (and their reuse distance) are probed once per hub
    graph = rlx_graph(model)
    exe = Session("cpu", use_cache=False).compile(graph)
    return exe._specialise(bind_inputs(graph, inputs(model, batch, seq), "profile")[1])[0]


def chains(model: str, batch: int, seq: int) -> None:
    """The row chains rlx-cpu forms for a workload, and the arena each memory plan needs."""
    from rlx_cpu.parallel import _Chain

    for dist in ("0", "8"):
        cp = _bound(model, batch, seq, {"RLX_CPU_REUSE_DISTANCE": dist, "RLX_CPU_CHAIN": "1"})
        runs = cp.runs  # type: ignore[attr-defined]
        found = [r for r in runs if isinstance(r, _Chain)]
        print(f"{model} batch {batch}, reuse distance {dist}: arena "
              f"{cp.program.plan.arena_bytes / 1e6:.1f} MB, {len(runs)} runs, "  # type: ignore[attr-defined]
              f"{len(found)} chain(s)")
        for ch in found:
            kernels = sum(len(st) for st in ch.stages)
            print(f"  chain: {kernels} kernels, {ch.barriers} barriers, {ch.chunks} pieces a stage")


def pool_handoff(reps: int) -> None:
    """Wall time of one pool dispatch of a trivial nogil kernel: on the caller alone, and split
    over every thread (the difference is the hand-off a split kernel or chain pays)."""
    import numba
    from rlx_cpu.parallel import pool

    @numba.njit(nogil=True)
    def touch(a: np.ndarray, lo: int, hi: int) -> None:  # type: ignore[no-untyped-def]
        for i in range(lo, hi):
            a[i] += 1.0

    a = np.zeros(64)
    p = pool()
    for parts in (1, p.threads):
        p.run(touch, 64, (a,), parts)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            p.run(touch, 64, (a,), parts)
            ts.append(time.perf_counter() - t0)
            time.sleep(0.0002)  # let the workers go back to sleep, as between two kernels
        ts.sort()
        print(f"{parts} thread(s): min {ts[0] * 1e6:.1f} us, p50 {ts[len(ts) // 2] * 1e6:.1f} us, "
              f"p90 {ts[int(len(ts) * 0.9)] * 1e6:.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="minilm", choices=["minilm", "resnet18", "mlp"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm", action="store_true", help="compare the two weight layouts instead")
    ap.add_argument("--chain", action="store_true", help="keep row chains (one step per chain)")
    ap.add_argument("--libs", action="store_true", help="compare the GEMM libraries instead")
    ap.add_argument("--chains", action="store_true", help="show the row chains and arena sizes instead")
    ap.add_argument("--pool", action="store_true", help="measure a pool hand-off instead")
    ap.add_argument("--zoo", help="profile this tests/_zoo.py model's ONNX export instead of a workload")
    ap.add_argument("--top", type=int, default=0, help="also list the N slowest single steps")
    a = ap.parse_args()
    if a.chains:
        chains(a.model, a.batch, a.seq)
    elif a.pool:
        pool_handoff(max(a.reps, 2000))
    elif a.libs:
        gemm_libraries(max(a.reps, 50))
    elif a.gemm:
        gemm_layouts(max(a.reps, 30))
    else:
        profile(a.model, a.batch, a.seq, a.reps, a.chain, a.zoo, a.top)


if __name__ == "__main__":
    main()
