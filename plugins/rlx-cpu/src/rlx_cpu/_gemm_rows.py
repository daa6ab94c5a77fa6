"""float32 GEMM row pieces (and ``linear``'s bias) as one nogil Numba call into oneDNN's sgemm.

Why native: in a row chain both threads step through ~100 kernels; each Python-level hop (a ctypes
call, a slice, a ufunc) takes the GIL, and a thread that finds it taken sleeps until woken (a
hand-off between threads costs ~20 us at the median here: ``python bench/profile_cpu.py --pool``).
Here the OpenMP setting, the GEMM and the bias add are one call. oneDNN is called through its
address (a runtime argument), so the kernel caches on disk.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_P8 = _I8.as_pointer()


@intrinsic
def _sgemm(typingctx: Any, addr: Any, ta: Any, tb: Any, m: Any, n: Any, k: Any, a: Any, lda: Any,
           b: Any, ldb: Any, c: Any, ldc: Any) -> Any:
    """``dnnl_sgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)`` through its address."""
    sig = types.int32(*([types.int64] * 12))

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fty = ir.FunctionType(_I32, [_I8, _I8, _I64, _I64, _I64, _F32, _P8, _I64, _P8, _I64, _F32,
                                     _P8, _I64])
        fn = builder.inttoptr(args[0], fty.as_pointer())
        ta8, tb8 = builder.trunc(args[1], _I8), builder.trunc(args[2], _I8)
        pa, pb, pc = (builder.inttoptr(args[i], _P8) for i in (6, 8, 10))
        return builder.call(fn, [ta8, tb8, args[3], args[4], args[5], ir.Constant(_F32, 1.0), pa,
                                 args[7], pb, args[9], ir.Constant(_F32, 0.0), pc, args[11]])
    return sig, codegen


@intrinsic
def _get_int(typingctx: Any, addr: Any) -> Any:
    """``int f(void)`` through its address (``omp_get_max_threads``)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn = builder.inttoptr(args[0], ir.FunctionType(_I32, []).as_pointer())
        return builder.sext(builder.call(fn, []), _I64)
    return types.int64(types.int64), codegen


@intrinsic
def _set_int(typingctx: Any, addr: Any, v: Any) -> Any:
    """``void f(int)`` through its address (``omp_set_num_threads``)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), [_I32]).as_pointer())
        builder.call(fn, [builder.trunc(args[1], _I32)])
        return context.get_dummy_value()
    return types.none(types.int64, types.int64), codegen


@njit(cache=True, nogil=True, error_model="numpy")
def gemm_rows(fns, ta, tb, a, lda, a_row, b, ldb, c, lo, hi):
    """Rows ``lo:hi`` of ``c = op(a) @ op(b)`` (float32) on this thread; ``fns`` = (sgemm,
    omp_get_max_threads, omp_set_num_threads) addresses; ``a_row``: elements from one row of
    op(a) to the next; ``ta``/``tb``: ord("N") or ord("T")."""
    if hi <= lo:
        return
    prev = _get_int(fns[1])
    if prev != 1:  # one OpenMP thread for this call: the row pool spreads the work
        _set_int(fns[2], 1)
    st = _sgemm(fns[0], ta, tb, hi - lo, c.shape[1], a.shape[1],
                a.ctypes.data + lo * a_row * 4, lda, b.ctypes.data, ldb,
                c.ctypes.data + lo * c.strides[0], c.strides[0] // 4)
    if prev != 1:
        _set_int(fns[2], prev)
    if st != 0:
        raise RuntimeError("oneDNN sgemm failed; set RLX_CPU_ONEDNN=0 to use OpenBLAS and report it")


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def linear_rows(fns, ta, tb, x, lda, a_row, w, ldb, bias, o, lo, hi):
    """Rows ``lo:hi`` of ``o = op(x) @ op(w) + bias``: :func:`gemm_rows`, then the bias on those
    rows while they are in cache."""
    gemm_rows(fns, ta, tb, x, lda, a_row, w, ldb, o, lo, hi)
    n = o.shape[1]
    for r in range(lo, hi):
        orow = o[r]
        for c in range(n):
            orow[c] += bias[c]
