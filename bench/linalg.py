"""Linear algebra benchmarks (not tests): RLX's linear algebra ops against SciPy/NumPy (CPU) or
CuPy (``--cuda``, on an NVIDIA GPU), in one run.

    python bench/linalg.py [--grid 1000] [--iters 300] [--dense 4096] [--json PATH]
    python bench/linalg.py --cuda [...]

Measures:
  * CG on the 2-D Poisson matrix of a grid x grid mesh (1M rows by default, f64), RLX's ``cg`` op
    (through ``Executable.run``) vs ``scipy.sparse.linalg.cg`` (``cupyx.scipy.sparse.linalg.cg``
    with --cuda) at the same ``rtol`` and ``maxiter``. The default ``rtol=1e-12`` is out of reach
    in ``--iters`` iterations, so both run exactly that many; the final residuals are printed to
    show both computed the same thing. Best of ``--reps``.
  * SpMV on the same matrix: RLX's ``spmv`` kernel alone and through ``Executable.run``, SciPy's
    ``A @ x``, in GB/s of compulsory traffic (values + column indices + row offsets + x + y),
    next to the machine's copy bandwidth (``np.copyto`` of 512 MiB: read + write).
  * Dense Cholesky and QR of a ``--dense``-square f64 matrix vs ``np.linalg`` (CuPy with --cuda).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np


def best(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def poisson_csr(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 5-point Laplacian of a k x k grid as CSR (int32 indices, f64 values), built directly."""
    n = k * k
    i = np.arange(n)
    r, c = i // k, i % k
    cols = np.stack([i - k, i - 1, i, i + 1, i + k], axis=1)
    vals = np.stack([np.full(n, -1.0)] * 2 + [np.full(n, 4.0)] + [np.full(n, -1.0)] * 2, axis=1)
    keep = np.stack([r > 0, c > 0, np.ones(n, bool), c < k - 1, r < k - 1], axis=1)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(keep.sum(1), out=indptr[1:])
    return indptr.astype(np.int32), cols[keep].astype(np.int32), vals[keep]


def _graph(op: str, n: int, nnz: int, **attrs: Any) -> Any:
    from rlx_core import GraphBuilder

    g = GraphBuilder(f"bench_{op}")
    ip = g.input("indptr", "i32", (n + 1,))
    ix = g.input("indices", "i32", (nnz,))
    v = g.input("values", "f64", (nnz,))
    g.output(g.op(op, ip, ix, v, g.input("b", "f64", (n,)), shape=(n, n), **attrs), "y")
    return g.build()


def bench_cpu(args: argparse.Namespace) -> dict[str, Any]:
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    from rlx_core import GraphBuilder, Session

    res: dict[str, Any] = {}
    ip, ix, v = poisson_csr(args.grid)
    n, nnz = ip.size - 1, ix.size
    a = sp.csr_array((v, ix, ip), shape=(n, n))
    b = np.random.default_rng(0).standard_normal(n)
    s = Session("cpu")
    feed = {"indptr": ip, "indices": ix, "values": v, "b": b}

    # CG
    exe = s.compile(_graph("cg", n, nnz, tol=args.rtol, max_iter=args.iters))
    exe.run(feed)  # JIT + warm-up
    out: dict[str, Any] = {}
    t_rlx = best(lambda: out.update(exe.run(feed)), args.reps)
    its = [0]

    def scipy_cg() -> None:
        its[0] = 0

        def cb(xk: Any) -> None:
            its[0] += 1
        out["scipy"] = spla.cg(a, b, rtol=args.rtol, atol=0.0, maxiter=args.iters, callback=cb)[0]
    t_sp = best(scipy_cg, args.reps)
    r_rlx = float(np.linalg.norm(b - a @ out["y"]) / np.linalg.norm(b))
    r_sp = float(np.linalg.norm(b - a @ out["scipy"]) / np.linalg.norm(b))
    res["cg"] = {"rows": n, "nnz": nnz, "iters": args.iters, "scipy_iters": its[0], "rtol": args.rtol,
                 "rlx_s": t_rlx, "scipy_s": t_sp, "ratio": t_rlx / t_sp, "rlx_rel_residual": r_rlx,
                 "scipy_rel_residual": r_sp}

    # SpMV
    from rlx_cpu.linalg import k_spmv

    y = np.zeros(n)
    kern = k_spmv([ip, ix, v, b], [y], {"shape": (n, n)})  # type: ignore[arg-type]
    kern()
    byts = nnz * (8 + 4) + (n + 1) * 4 + 2 * n * 8
    t_k = best(kern, args.reps * 5)
    exe_mv = s.compile(_graph("spmv", n, nnz))
    exe_mv.run(feed)
    t_run = best(lambda: exe_mv.run(feed), args.reps * 5)
    t_spmv = best(lambda: a @ b, args.reps * 5)
    big = np.ones(64 * 2**20)  # 512 MiB
    dst = np.empty_like(big)
    t_copy = best(lambda: np.copyto(dst, big), 5)
    res["spmv"] = {"bytes": byts, "rlx_kernel_GBs": byts / t_k / 1e9, "rlx_run_GBs": byts / t_run / 1e9,
                   "scipy_GBs": byts / t_spmv / 1e9, "copy_GBs": 2 * big.nbytes / t_copy / 1e9,
                   "rlx_kernel_s": t_k, "rlx_run_s": t_run, "scipy_s": t_spmv}

    # dense
    rng = np.random.default_rng(1)
    m = rng.standard_normal((args.dense, args.dense))
    spd = m @ m.T / args.dense + np.eye(args.dense)
    for op, arr, ref in [("cholesky", spd, lambda: np.linalg.cholesky(spd)),
                         ("qr", m, lambda: np.linalg.qr(m))]:
        if op not in args.dense_ops.split(","):
            continue
        g = GraphBuilder(f"bench_{op}")
        outs = g.op(op, g.input("a", "f64", arr.shape))
        for i, o in enumerate(outs if isinstance(outs, tuple) else (outs,)):
            g.output(o, f"o{i}")
        e = s.compile(g.build())
        e.run({"a": arr})
        t_r = best(partial(e.run, {"a": arr}), args.dense_reps)
        t_n = best(ref, args.dense_reps)
        res[op] = {"n": args.dense, "rlx_s": t_r, "numpy_s": t_n, "ratio": t_r / t_n}
    return res


def _cg_tol(cg: Any) -> str:
    """cg's relative-tolerance keyword: CuPy renamed ``tol`` to ``rtol`` (as SciPy did)."""
    import inspect

    return "rtol" if "rtol" in inspect.signature(cg).parameters else "tol"


def bench_cuda(args: argparse.Namespace) -> dict[str, Any]:
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cspla

    from rlx_core import GraphBuilder, Session

    def sync_best(fn: Callable[[], Any], reps: int) -> float:
        def run() -> None:
            fn()
            cp.cuda.Device().synchronize()
        return best(run, reps)

    res: dict[str, Any] = {}
    ip, ix, v = poisson_csr(args.grid)
    n, nnz = ip.size - 1, ix.size
    b = np.random.default_rng(0).standard_normal(n)
    s = Session("cuda")
    ad = csp.csr_matrix((cp.asarray(v), cp.asarray(ix), cp.asarray(ip)), shape=(n, n))
    bd = cp.asarray(b)
    # The matrix as graph constants (uploaded once); b goes in, x comes out each run.
    g = GraphBuilder("bench_cg_cuda")
    mat = [g.param("indptr", ip), g.param("indices", ix), g.param("values", v)]
    x = g.op("cg", *mat, g.input("b", "f64", (n,)), shape=(n, n), tol=args.rtol, max_iter=args.iters)
    g.output(x, "x")
    exe = s.compile(g.build())
    out = exe.run({"b": b})
    t_rlx = sync_best(lambda: out.update(exe.run({"b": b})), args.reps)
    xs: dict[str, Any] = {}
    tol_kw = {_cg_tol(cspla.cg): args.rtol}
    t_cp = sync_best(lambda: xs.update(x=cspla.cg(ad, bd, atol=0.0, maxiter=args.iters, **tol_kw)[0]),
                     args.reps)
    a_host = None
    try:
        import scipy.sparse as sp

        a_host = sp.csr_array((v, ix, ip), shape=(n, n))
    except ImportError:
        pass
    res["cg"] = {"rows": n, "nnz": nnz, "iters": args.iters, "rtol": args.rtol, "rlx_s": t_rlx,
                 "cupy_s": t_cp, "ratio": t_rlx / t_cp}
    if a_host is not None:
        bn = float(np.linalg.norm(b))
        res["cg"]["rlx_rel_residual"] = float(np.linalg.norm(b - a_host @ out["x"])) / bn
        res["cg"]["cupy_rel_residual"] = float(np.linalg.norm(b - a_host @ cp.asnumpy(xs["x"]))) / bn
    # SpMV: the kernel through a graph whose matrix is constant (x in, y out include the copies).
    g = GraphBuilder("bench_spmv_cuda")
    mat = [g.param("indptr", ip), g.param("indices", ix), g.param("values", v)]
    g.output(g.op("spmv", *mat, g.input("x", "f64", (n,)), shape=(n, n)), "y")
    e = s.compile(g.build())
    e.run({"x": b})
    byts = nnz * 12 + (n + 1) * 4 + 2 * n * 8
    t_run = sync_best(lambda: e.run({"x": b}), args.reps * 5)
    t_cp_mv = sync_best(lambda: ad @ bd, args.reps * 5)
    src = cp.ones(64 * 2**20)
    dst = cp.empty_like(src)
    t_copy = sync_best(lambda: cp.copyto(dst, src), 10)
    res["spmv"] = {"bytes": byts, "rlx_run_GBs": byts / t_run / 1e9, "cupy_GBs": byts / t_cp_mv / 1e9,
                   "copy_GBs": 2 * src.nbytes / t_copy / 1e9, "rlx_run_s": t_run, "cupy_s": t_cp_mv}
    rng = np.random.default_rng(1)
    m = rng.standard_normal((args.dense, args.dense))
    spd = m @ m.T / args.dense + np.eye(args.dense)
    refs: list[tuple[str, np.ndarray, Callable[[Any], Any]]] = [
        ("cholesky", spd, lambda d: cp.linalg.cholesky(d)), ("qr", m, lambda d: cp.linalg.qr(d))]
    for op, arr, ref in refs:
        if op not in args.dense_ops.split(","):
            continue
        g = GraphBuilder(f"bench_{op}_cuda")
        outs = g.op(op, g.input("a", "f64", arr.shape))
        for i, o in enumerate(outs if isinstance(outs, tuple) else (outs,)):
            g.output(o, f"o{i}")
        e = s.compile(g.build())
        e.run({"a": arr})
        dev = cp.asarray(arr)
        t_r = sync_best(partial(e.run, {"a": arr}), args.dense_reps)
        t_c = sync_best(partial(ref, dev), args.dense_reps)
        # Executable.run copies a in and the factors out over PCIe; the CuPy figure has none.
        res[op] = {"n": args.dense, "rlx_s": t_r, "cupy_s": t_c, "ratio": t_r / t_c,
                   "host_copy_bytes": int(arr.nbytes * (2 if op == "cholesky" else 3))}
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cuda", action="store_true", help="RLX on the cuda backend vs CuPy")
    p.add_argument("--grid", type=int, default=1000, help="Poisson grid side (rows = grid^2)")
    p.add_argument("--iters", type=int, default=300, help="CG iterations (maxiter)")
    p.add_argument("--rtol", type=float, default=1e-12, help="CG relative tolerance")
    p.add_argument("--dense", type=int, default=4096, help="dense matrix side")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dense-reps", type=int, default=2)
    p.add_argument("--dense-ops", default="cholesky,qr", help="dense ops to time (comma list; '' for none)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    res = bench_cuda(args) if args.cuda else bench_cpu(args)
    res["machine"] = {"platform": platform.platform(), "processor": platform.processor(),
                      "mode": "cuda" if args.cuda else "cpu"}
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
