"""CPU kernels for the linear algebra ops (``rlx_core.plugin.linalg``): CSR products and conjugate
gradient in Numba, BiCGSTAB on them, dense factorizations through NumPy's LAPACK, and the sparse
direct solve through SciPy's SuperLU (claimed only where SciPy is installed: rlx-cpu does not
depend on it; ``pip install rlx-cpu[sparse]``).

CG makes three fused passes an iteration (``q = A p`` with ``p.q``; the x/r update with ``r.r``
and the Jacobi step; the new direction) where SciPy's Python loop makes about nine, split over the
cores by :mod:`rlx_cpu.parallel` in fixed blocks whose partial dot products add up in block order,
so results do not depend on the thread count.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, DType, InputError, KernelClaim, linalg

#: Rows per block of the Numba kernels (the unit of work splitting and of partial dot products).
BLOCK = 2048
#: Below this many stored entries the sparse products run in NumPy (no JIT on first use).
NUMBA_MIN_NNZ = 16384
Run = Callable[[], None]


def has_scipy() -> bool:
    """SciPy is importable (checked without importing it: discovery stays fast)."""
    return importlib.util.find_spec("scipy") is not None


def _nb() -> Any:
    from . import _sparse

    return _sparse


def _blocks(fn: Any, n: int, args: Sequence[Any], work: int) -> Run:
    """``fn(*args, lo, hi)`` over the ``ceil(n / BLOCK)`` blocks, on as many threads as ``work`` is worth."""
    from .parallel import parts_for, pool

    nb = -(-n // BLOCK)
    parts = min(parts_for(work), nb)
    a = tuple(args)
    if parts <= 1:
        return lambda: fn(*a, 0, nb)
    p = pool()
    return lambda: p.run(fn, nb, a, parts, parts * 4)


def _contiguous(arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], Run]:
    """C-contiguous stand-ins for ``arrays`` (the arrays themselves when they already are) and a
    function copying the others in before a run, so kernels bind their operands once."""
    bufs = [a if a.flags.c_contiguous else np.empty(a.shape, a.dtype) for a in arrays]
    pairs = [(b, a) for b, a in zip(bufs, arrays) if b is not a]

    def refresh() -> None:
        for b, a in pairs:
            np.copyto(b, a)
    return bufs, refresh


def _bad(op: str) -> InputError:
    return InputError(f"{op}: the CSR operands are broken (offsets not rising within [0, nnz], or a "
                      f"column outside the matrix)", fix="build them with rlx_core.sparse.CSR")


def _shape(attrs: Attrs) -> tuple[int, int]:
    s: Any = attrs["shape"]
    return int(s[0]), int(s[1])


# -- spmv, spmm, csr_to_dense, csr_add ---------------------------------------------------------

def _product(op: str, ins: Sequence[np.ndarray], y: np.ndarray, attrs: Attrs) -> Run:
    """y = A x for a vector or a matrix x: NumPy for few entries, else the Numba row kernels."""
    n, m = _shape(attrs)
    ip, ix, v, x = ins
    if ix.shape[0] < NUMBA_MIN_NNZ:
        wide = np.complex128 if v.dtype.kind == "c" else np.float64

        def small() -> None:
            rows = linalg.csr_rows(ip, ix, n, m, op)
            cols = ix.astype(np.int64)
            prod = v[:, None] * x[cols] if x.ndim == 2 else v * x[cols]
            acc = np.zeros(y.shape, wide)
            np.add.at(acc, rows, prod)
            np.copyto(y, acc, casting="unsafe")
        return small
    nb = _nb()
    fn = nb.spmm_blocks if x.ndim == 2 else nb.spmv_blocks
    (ipc, ixc, vc, xc, yc), refresh = _contiguous((ip, ix, v, x, y))
    bad = np.zeros(1, np.int8)
    work = 4 * ix.shape[0] * (x.shape[1] if x.ndim == 2 else 1)
    run = _blocks(fn, n, (ipc, ixc, vc, xc, yc, bad, BLOCK), work)

    def big() -> None:
        refresh()
        bad[0] = 0
        run()
        if bad[0]:
            raise _bad(op)
        if yc is not y:
            np.copyto(y, yc)
    return big


def k_spmv(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    return _product("spmv", ins, outs[0], attrs)


def k_spmm(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    return _product("spmm", ins, outs[0], attrs)


def k_csr_to_dense(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    ip, ix, v = ins
    o = outs[0]
    n, m = _shape(attrs)

    def run() -> None:
        rows = linalg.csr_rows(ip, ix, n, m, "csr_to_dense")
        o[...] = 0
        np.add.at(o, (rows, ix.astype(np.int64)), v)
    return run


def k_csr_add(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    aip, aix, av, bip, bix, bv = ins
    oip, oix, ov = outs
    n, m = _shape(attrs)

    def run() -> None:
        ra = linalg.csr_rows(aip, aix, n, m, "csr_add")
        rb = linalg.csr_rows(bip, bix, n, m, "csr_add")
        # Row r holds a's entries then b's: a's entry k lands at bip[r] + k, b's at aip[r + 1] + k.
        pa = bip.astype(np.int64)[ra] + np.arange(aix.shape[0])
        pb = aip.astype(np.int64)[rb + 1] + np.arange(bix.shape[0])
        np.add(aip, bip, out=oip)
        oix[pa], ov[pa] = aix, av
        oix[pb], ov[pb] = bix, bv
    return run


# -- iterative solvers -------------------------------------------------------------------------

def k_cg(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    n, m = _shape(attrs)
    max_iter, tol = int(attrs["max_iter"]), float(attrs["tol"])  # type: ignore[arg-type]
    jacobi = attrs["precond"] == "jacobi"
    (ip, ix, v, b, x), refresh = _contiguous((*ins, outs[0]))
    dt = x.dtype
    nb = _nb()
    nblk = max(1, -(-n // BLOCK))
    r, p, q = (np.zeros(n, dt) for _ in range(3))
    z = np.zeros(n if jacobi else 0, dt)
    dinv = np.zeros(n if jacobi else 0, dt)
    part, part_rr, part_rz = (np.zeros(nblk) for _ in range(3))
    sc = np.zeros(2)  # alpha, beta: read by the bound kernels
    bad = np.zeros(1, np.int8)
    spmv_dot = _blocks(nb.spmv_dot_blocks, n, (ip, ix, v, p, q, part, bad, BLOCK), 4 * ix.shape[0] + 8 * n)
    update = _blocks(nb.cg_update_blocks, n, (x, r, p, q, z, dinv, sc, jacobi, part_rr, part_rz, BLOCK),
                     8 * n)
    direction = _blocks(nb.cg_direction_blocks, n, (p, z if jacobi else r, sc, BLOCK), 4 * n)

    def solve() -> None:
        x[...] = 0
        np.copyto(r, b)
        bound = tol * float(np.linalg.norm(b.astype(np.float64)))
        if n == 0 or float(np.linalg.norm(r.astype(np.float64))) <= bound:
            return
        if jacobi:
            linalg.csr_rows(ip, ix, n, m, "cg")  # the diagonal kernel reads unchecked
            d = np.zeros(n)
            nb.diagonal(ip, ix, v, d)
            np.copyto(dinv, np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 1.0), casting="unsafe")
            np.multiply(dinv, r, out=z)
            np.copyto(p, z)
            rz = float(np.dot(r.astype(np.float64), z.astype(np.float64)))
        else:
            np.copyto(p, r)
            rz = float(np.dot(r.astype(np.float64), r.astype(np.float64)))
        for _ in range(max_iter):
            bad[0] = 0
            spmv_dot()
            if bad[0]:
                raise _bad("cg")
            pq = float(part.sum())
            if pq == 0:
                break
            sc[0] = rz / pq
            update()
            if float(np.sqrt(part_rr.sum())) <= bound:
                break
            rz_new = float(part_rz.sum())
            if rz_new == 0:
                break
            sc[1] = rz_new / rz
            direction()
            rz = rz_new

    def run() -> None:
        refresh()
        solve()
        if x is not outs[0]:
            np.copyto(outs[0], x)
    return run


class _CsrOperator:
    """``A @ x`` and ``A.diagonal()`` of a checked CSR matrix, for the shared BiCGSTAB loop."""

    def __init__(self, ip: np.ndarray, ix: np.ndarray, v: np.ndarray, n: int, m: int) -> None:
        self.rows = linalg.csr_rows(ip, ix, n, m, "bicgstab")
        self.ip, self.ix, self.v, self.n = ip, ix, v, n
        self.cols = ix.astype(np.int64)
        self.y = np.zeros(n, v.dtype)
        self.big = ix.shape[0] >= NUMBA_MIN_NNZ

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        if not self.big:
            y = np.bincount(self.rows, weights=self.v * x[self.cols], minlength=self.n)
            return y.astype(self.v.dtype)
        y = np.empty(self.n, self.v.dtype)
        bad = np.zeros(1, np.int8)
        _blocks(_nb().spmv_blocks, self.n, (self.ip, self.ix, self.v, np.ascontiguousarray(x), y, bad, BLOCK),
                4 * self.ix.shape[0])()
        return y

    def diagonal(self) -> np.ndarray:
        d = np.zeros(self.n)
        np.add.at(d, self.rows[self.cols == self.rows], self.v[self.cols == self.rows])
        return d.astype(self.v.dtype)


def k_bicgstab(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    n, m = _shape(attrs)
    max_iter, tol = int(attrs["max_iter"]), float(attrs["tol"])  # type: ignore[arg-type]
    jacobi = attrs["precond"] == "jacobi"
    ip, ix, v, b = ins
    x = outs[0]

    def run() -> None:
        a = _CsrOperator(np.ascontiguousarray(ip), np.ascontiguousarray(ix), np.ascontiguousarray(v), n, m)
        np.copyto(x, linalg.bicgstab_reference(a, np.array(b, copy=True), max_iter, tol, jacobi))
    return run


def k_sparse_solve(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    n, m = _shape(attrs)
    ip, ix, v, b = ins
    x = outs[0]

    def run() -> None:
        import scipy.sparse as sp
        from scipy.sparse.linalg import splu

        linalg.csr_rows(ip, ix, n, m, "sparse_solve")
        if n == 0:
            return
        a = sp.csr_array((v, ix, ip), shape=(n, m)).tocsc()  # tocsc adds duplicates up
        try:
            lu = splu(a)
        except RuntimeError as e:  # SuperLU: "Factor is exactly singular"
            raise InputError(f"sparse_solve: {e}", fix="the matrix must be nonsingular") from None
        np.copyto(x, lu.solve(np.array(b, copy=True)), casting="unsafe")
    return run


# -- dense -------------------------------------------------------------------------------------

def k_solve(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, b = ins
    x = outs[0]

    def run() -> None:
        if a.shape[-1] == 0 or b.size == 0:
            x[...] = 0
            return
        try:
            np.copyto(x, np.linalg.solve(a, b))
        except np.linalg.LinAlgError:
            raise InputError("solve: a matrix is singular", fix="pass nonsingular matrices") from None
    return run


def k_cholesky(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, o = ins[0], outs[0]

    def run() -> None:
        if a.shape[-1] == 0:
            return
        try:
            np.copyto(o, np.linalg.cholesky(a))
        except np.linalg.LinAlgError:
            raise InputError("cholesky: a matrix is not positive definite",
                             fix="pass symmetric positive definite matrices") from None
    return run


def k_lu(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a = ins[0]
    scipy = has_scipy()

    def run() -> None:
        if a.size == 0:
            return
        if scipy:
            from scipy.linalg import lu

            res = lu(a)  # getrf; batched since SciPy 1.11
        else:
            flat = [linalg.lu_reference(np.array(m)) for m in a.reshape((-1, *a.shape[-2:]))]
            res = tuple(np.stack([f[i] for f in flat]).reshape(a.shape) for i in range(3))
        for o, r in zip(outs, res):
            np.copyto(o, r, casting="unsafe")
    return run


def _dense(fn: Callable[[np.ndarray], Sequence[np.ndarray]], empty_ok: bool = True) -> Any:
    def factory(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
        a = ins[0]

        def run() -> None:
            if a.size == 0:
                for o in outs:
                    o[...] = 0
                return
            for o, r in zip(outs, fn(a)):
                np.copyto(o, r, casting="unsafe")
        return run
    return factory


def k_qr(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a = ins[0]
    oq, orr = outs

    def run() -> None:
        if a.size == 0:
            return
        q, r = np.linalg.qr(a, mode="reduced")
        # diag(r) >= 0 (rlx_core's qr convention), written straight into the outputs: one pass each.
        s = np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0).astype(a.dtype)
        np.multiply(q, s[..., None, :], out=oq, casting="unsafe")
        np.multiply(r, s[..., :, None], out=orr, casting="unsafe")
    return run


def k_lstsq(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, b = ins
    x = outs[0]

    def run() -> None:
        if a.size == 0:
            x[...] = 0
            return
        np.copyto(x, np.linalg.lstsq(a, b, rcond=None)[0], casting="unsafe")
    return run


FACTORIES: dict[str, Any] = {
    "cpu.spmv": k_spmv, "cpu.spmm": k_spmm, "cpu.csr_to_dense": k_csr_to_dense, "cpu.csr_add": k_csr_add,
    "cpu.cg": k_cg, "cpu.bicgstab": k_bicgstab, "cpu.sparse_solve": k_sparse_solve,
    "cpu.solve": k_solve, "cpu.cholesky": k_cholesky, "cpu.lu": k_lu,
    "cpu.qr": k_qr,
    "cpu.eigh": _dense(lambda a: linalg.eigh_reference(a)),
    "cpu.svd": _dense(lambda a: linalg.svd_reference(a)), "cpu.lstsq": k_lstsq,
}


def claims() -> list[KernelClaim]:
    """The linear algebra claims (``cpu.sparse_solve`` only where SciPy is installed)."""
    idx = frozenset({DType.I32, DType.I64})
    f = frozenset({DType.F32, DType.F64})
    fc = f | {DType.C64}
    out = [KernelClaim(op, f"cpu.{op}", dtypes=idx | fc, out_dtypes=idx | fc)
           for op in ("spmv", "spmm", "csr_to_dense", "csr_add")]
    out += [KernelClaim(op, f"cpu.{op}", dtypes=idx | f, out_dtypes=f) for op in ("cg", "bicgstab")]
    if has_scipy():
        out.append(KernelClaim("sparse_solve", "cpu.sparse_solve", dtypes=idx | f, out_dtypes=f))
    out += [KernelClaim(op, f"cpu.{op}", dtypes=f) for op in ("solve", "cholesky", "lu", "qr", "eigh", "svd",
                                                              "lstsq")]
    return out
