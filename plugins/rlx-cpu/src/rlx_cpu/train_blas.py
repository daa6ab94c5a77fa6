"""Direct calls into NumPy's own OpenBLAS: GEMM with ``beta`` (accumulate into the output) and
in-place AXPY, for the fused kernels of :mod:`rlx_cpu.train_fuse`.

``np.matmul`` always overwrites its output, so ``m = mu * m + A @ B`` costs a GEMM into a temporary
plus two passes over ``m``; BLAS does it in the GEMM itself (``beta = mu``), and ``p -= lr * m`` is
one AXPY pass instead of a multiply and a subtract. The library is the one NumPy loaded (same
thread pool, same kernels as ``np.matmul``), found by its exported ILP64 CBLAS symbols; where it
cannot be found :func:`available` is false and callers keep the NumPy path.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_LIB: Any = None
_TRIED = False
SGEMM: Any = None
DGEMM: Any = None
SAXPY: Any = None
DAXPY: Any = None
SET_LOCAL: Any = None
GET_THREADS: Any = None


def _candidates() -> list[str]:
    base = os.path.dirname(np.__file__)
    pats = [os.path.join(base, os.pardir, "numpy.libs", "*openblas*64*.so*"),
            os.path.join(base, ".dylibs", "*openblas*64*.dylib")]
    out: list[str] = []
    for p in pats:
        out += sorted(glob.glob(p))
    return out


def _load() -> None:
    global _LIB, _TRIED, SGEMM, DGEMM, SAXPY, DAXPY
    if _TRIED:
        return
    _TRIED = True
    from .settings import DIRECT_BLAS

    if not DIRECT_BLAS.get():
        return
    i64, ci, f32, f64, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_void_p
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)  # already loaded by NumPy: the same handle, the same thread pool
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("", "64_")):
            try:
                sg = getattr(lib, f"{prefix}cblas_sgemm{suffix}")
                dg = getattr(lib, f"{prefix}cblas_dgemm{suffix}")
                sa = getattr(lib, f"{prefix}cblas_saxpy{suffix}")
                da = getattr(lib, f"{prefix}cblas_daxpy{suffix}")
            except AttributeError:
                continue
            for fn, real in ((sg, f32), (dg, f64)):
                fn.restype = None
                fn.argtypes = [ci, ci, ci, i64, i64, i64, real, vp, i64, vp, i64, real, vp, i64]
            for fn, real in ((sa, f32), (da, f64)):
                fn.restype = None
                fn.argtypes = [i64, real, vp, i64, vp, i64]
            _LIB, SGEMM, DGEMM, SAXPY, DAXPY = lib, sg, dg, sa, da
            global SET_LOCAL, GET_THREADS
            try:
                SET_LOCAL = lib.openblas_set_num_threads_local
                GET_THREADS = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}")
                SET_LOCAL.argtypes, SET_LOCAL.restype = [ctypes.c_int], ctypes.c_int
                GET_THREADS.argtypes, GET_THREADS.restype = [], ctypes.c_int
            except AttributeError:
                SET_LOCAL = GET_THREADS = None
            return


def available() -> bool:
    _load()
    return _LIB is not None


def _operand(a: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D operand read row-major, or None."""
    if a.ndim != 2:
        return None
    isz = a.itemsize
    s0, s1 = a.strides
    r, c = a.shape
    if (s1 == isz or c == 1) and s0 % isz == 0 and s0 // isz >= max(c, 1):
        return _NO_TRANS, max(s0 // isz, c, 1)
    if (s0 == isz or r == 1) and s1 % isz == 0 and s1 // isz >= max(r, 1):
        return _TRANS, max(s1 // isz, r, 1)
    return None


def gemm_call(a: np.ndarray, b: np.ndarray, out: np.ndarray, alpha: float = 1.0,
              beta: float = 0.0) -> Any:
    """A bound ``out = alpha * a @ b + beta * out`` (2-D, one float dtype, ``out`` C-contiguous and
    not overlapping ``a``/``b``), or None when BLAS cannot take these operands as they are."""
    if not available() or out.ndim != 2 or a.ndim != 2 or b.ndim != 2:
        return None
    if out.flags.f_contiguous and not out.flags.c_contiguous:
        return gemm_call(b.T, a.T, out.T, alpha, beta)  # (a @ b)^T = b^T @ a^T, row-major
    dt = out.dtype
    if dt not in (np.float32, np.float64) or a.dtype != dt or b.dtype != dt:
        return None
    if not out.flags.c_contiguous or not out.flags.writeable or out.size == 0:
        return None
    if np.shares_memory(out, a) or np.shares_memory(out, b):
        return None
    m, k = a.shape
    k2, n = b.shape
    if k != k2 or out.shape != (m, n) or k == 0:
        return None
    oa, ob = _operand(a), _operand(b)
    if oa is None or ob is None:
        return None
    fn = SGEMM if dt == np.float32 else DGEMM
    ta, lda = oa
    tb, ldb = ob
    ldc = max(n, 1)
    al, be = float(alpha), float(beta)
    #: the operand addresses, read at every call: a caller may point ``a`` or ``b`` at another array
    #: of the same layout (:meth:`rlx_cpu.program.CpuProgram.bind_input`)
    ptrs = [a.ctypes.data, b.ctypes.data, out.ctypes.data]

    def run() -> None:
        fn(_ROW_MAJOR, ta, tb, m, n, k, al, ptrs[0], lda, ptrs[1], ldb, be, ptrs[2], ldc)
    run.keep = (a, b, out)  # type: ignore[attr-defined]  # the arrays stay alive with the run
    run.ptrs = ptrs  # type: ignore[attr-defined]
    run.flops = 2 * m * n * k  # type: ignore[attr-defined]
    return run


def axpy_call(x: np.ndarray, y: np.ndarray, alpha: float) -> Any:
    """A bound in-place ``y += alpha * x`` over contiguous arrays of one float dtype, or None."""
    if not available() or x.shape != y.shape or x.dtype != y.dtype or x.dtype not in (np.float32, np.float64):
        return None
    if x.ndim == 2 and x.flags.f_contiguous and y.flags.f_contiguous and not y.flags.c_contiguous:
        x, y = x.T, y.T  # the same elements in the same memory order
    if not (x.flags.c_contiguous and y.flags.c_contiguous and y.flags.writeable) or x.size == 0:
        return None
    if np.shares_memory(x, y):
        return None
    fn = SAXPY if x.dtype == np.float32 else DAXPY
    n, al, px, py = x.size, float(alpha), x.ctypes.data, y.ctypes.data
    keep = (x, y)

    def run() -> None:
        fn(n, al, px, 1, py, 1)
    run.keep = keep  # type: ignore[attr-defined]
    return run


def pair_call(first: Any, second: Any) -> Any:
    """A run doing two independent GEMM runs at once, each on one BLAS thread (two small GEMMs on
    one core each beat one after the other on two: OpenBLAS splits a 128-row GEMM poorly), the
    second on rlx-cpu's row pool. Falls back to one after the other when BLAS is limited to one
    thread (``threadpoolctl``) or the pool has one thread."""
    if not available() or SET_LOCAL is None or GET_THREADS is None:
        return None
    from .parallel import pool

    p = pool()
    if p.threads < 2:
        return None
    setl, nthreads = SET_LOCAL, GET_THREADS

    def part(lo: int, hi: int) -> None:
        prev = setl(1)
        try:
            (first if lo == 0 else second)()
        finally:
            setl(prev)

    def run() -> None:
        if nthreads() < 2:
            first()
            second()
        else:
            p.run(part, 2, (), 2)
    run.parts = (first, second)  # type: ignore[attr-defined]
    return run


__all__ = ["available", "axpy_call", "gemm_call", "pair_call"]
