"""Linear algebra ops: CSR sparse matrices, iterative and direct solvers, dense factorizations.

**Sparse matrices** stay ordinary tensors in the IR (as JAX's ``BCSR``): a CSR matrix is three
operands, ``indptr`` (``n + 1`` row offsets), ``indices`` (column of each stored entry) and
``values``, both index operands i32 or i64 alike, plus a static ``shape = (n, m)`` attribute on
every sparse op. So ``TensorType`` is unchanged, every pass already understands the operands, and
a pattern is reused across calls for free. A CSR operand may hold unsorted columns and duplicate
entries; duplicates add up (SciPy's rule). Structure that breaks the format (offsets not rising
from 0 to ``nnz``, a column outside ``[0, m)``) is an :class:`~rlx_core.errors.InputError`.

Ops whose output size depends on the data are not ops: ``from_dense`` (its ``nnz`` is a count of
nonzeros) is the host helper :func:`rlx_core.sparse.CSR.from_dense`; ``csr_add`` keeps its output
static by concatenating the two patterns row by row (``nnz_a + nnz_b`` entries, duplicates summed
by every consumer), and scaling is ``mul`` on the ``values`` operand.

**Solvers** (``cg``, ``bicgstab``: ``max_iter``/``tol`` attributes, ``tol`` relative to ``|b|`` as
SciPy's ``rtol``; ``sparse_solve``: a direct LU solve) and **dense** ``solve``, ``cholesky``,
``lu``, ``qr``, ``eigh``, ``svd``, ``lstsq`` are MIR ops without a decomposition: a backend runs
them natively (LAPACK, cuSOLVER, ...) or refuses them clearly. Outputs that a factorization leaves
free are fixed so every backend can be checked against one float64 reference: ``qr`` has
``diag(r) >= 0``, ``eigh`` and ``svd`` give each (left) singular/eigen vector its largest-magnitude
component positive (the first such on ties). ``solve``, ``cholesky`` and ``eigh`` carry reverse-
and forward-mode rules.

Conformance tolerances follow the problems' condition (``extra["condition"]``: ``(k, scale)``
from the float64 inputs, read by ``rlx_conformance.cases.accumulation``): a factorization is
accurate to about ``n * kappa * eps`` relative, not to an ulp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...dtypes import INDEX_DTYPES, DType
from ...errors import DTypeError, InputError, IRError, ShapeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, Dim, TensorType

FLOATS = (DType.F32, DType.F64)
SPARSE_VALUES = (DType.F32, DType.F64, DType.C64)
PRECONDITIONERS = ("none", "jacobi")
SHAPE_DOC = "the sparse matrix's (rows, cols), static"


# -- CSR operands ------------------------------------------------------------------------------

def _shape_attr(op: str, attrs: Attrs) -> tuple[int, int]:
    s = tuple(attrs["shape"])  # type: ignore[arg-type]
    if len(s) != 2 or min(s) < 0:
        raise ShapeError(f"{op}: shape={s} is not (rows, cols) with rows, cols >= 0",
                         fix="pass shape=(n, m) of the CSR matrix")
    return int(s[0]), int(s[1])


def _check_csr(op: str, ts: Sequence[TensorType], attrs: Attrs,
               values: Sequence[DType] = SPARSE_VALUES) -> tuple[int, int, DType]:
    """Check one CSR triple (indptr, indices, values) against ``shape``; returns (n, m, dtype)."""
    ip, ix, v = ts[0], ts[1], ts[2]
    n, m = _shape_attr(op, attrs)
    if ip.dtype not in INDEX_DTYPES or ix.dtype != ip.dtype:
        raise DTypeError(f"{op}: indptr is {ip.dtype} and indices {ix.dtype}",
                         fix="indptr and indices are both i32 or both i64")
    if v.dtype not in values:
        raise DTypeError(f"{op} does not accept {v.dtype} values",
                         fix=f"{op} accepts {', '.join(map(str, values))}; cast the values")
    if ip.rank != 1 or ix.rank != 1 or v.rank != 1:
        raise ShapeError(f"{op}: CSR operands must be vectors, got indptr {ip.shape}, indices "
                         f"{ix.shape}, values {v.shape}", fix="pass the three CSR arrays as 1-D")
    if isinstance(ip.shape[0], int) and ip.shape[0] != n + 1:
        raise ShapeError(f"{op}: indptr has {ip.shape[0]} entries, shape={n, m} needs {n + 1}",
                         fix="indptr holds rows + 1 offsets")
    if ix.shape != v.shape:
        raise ShapeError(f"{op}: indices {ix.shape} and values {v.shape} differ",
                         fix="one column index per stored value")
    return n, m, v.dtype


def csr_rows(indptr: np.ndarray, indices: np.ndarray, n: int, m: int, op: str) -> np.ndarray:
    """The row of each stored entry, after checking the CSR structure (InputError if broken)."""
    ip = np.asarray(indptr, np.int64)
    ix = np.asarray(indices, np.int64)
    if ip.shape != (n + 1,) or ip[0] != 0 or ip[-1] != ix.size or (np.diff(ip) < 0).any():
        raise InputError(f"{op}: indptr is not a CSR offset vector (must rise from 0 to nnz={ix.size} "
                         f"over {n + 1} entries)", fix="build the operands with rlx_core.sparse.CSR")
    if ix.size and (ix.min() < 0 or ix.max() >= m):
        raise InputError(f"{op}: a column index is outside [0, {m})",
                         fix="build the operands with rlx_core.sparse.CSR")
    return np.repeat(np.arange(n), np.diff(ip))


def csr_dense(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, n: int, m: int,
              op: str = "csr") -> np.ndarray:
    """The dense matrix of a CSR triple (duplicates add up)."""
    rows = csr_rows(indptr, indices, n, m, op)
    out = np.zeros((n, m), np.result_type(values, np.float64))
    np.add.at(out, (rows, np.asarray(indices, np.int64)), values)
    return out


def _kappa(a: np.ndarray) -> float:
    """2-norm condition number (inf for a singular matrix), at least 1."""
    a = np.asarray(a)
    if a.size == 0:
        return 1.0
    with np.errstate(all="ignore"):
        k = float(np.max(np.linalg.cond(a)))
    return max(k, 1.0) if np.isfinite(k) else 1e16


def _int(d: Dim) -> int:
    return d if isinstance(d, int) else 1


def _maxabs(*xs: Any) -> float:
    vals = [float(np.max(np.abs(x))) for x in xs if np.asarray(x).size]
    return max([1.0, *vals])


# -- spmv, spmm, csr_to_dense, csr_add ---------------------------------------------------------

def _infer_spmv(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    n, m, dt = _check_csr("spmv", ts, attrs)
    x = ts[3]
    if x.dtype != dt:
        raise DTypeError(f"spmv: x is {x.dtype}, values are {dt}", fix="cast x to the values' dtype")
    if x.rank != 1 or (isinstance(x.shape[0], int) and x.shape[0] != m):
        raise ShapeError(f"spmv: x is {x.shape}, the matrix is {n}x{m}", fix=f"x must be ({m},)")
    return [TensorType(dt, (n,))]


def _infer_spmm(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    n, m, dt = _check_csr("spmm", ts, attrs)
    x = ts[3]
    if x.dtype != dt:
        raise DTypeError(f"spmm: x is {x.dtype}, values are {dt}", fix="cast x to the values' dtype")
    if x.rank != 2 or (isinstance(x.shape[0], int) and x.shape[0] != m):
        raise ShapeError(f"spmm: x is {x.shape}, the matrix is {n}x{m}", fix=f"x must be ({m}, k)")
    return [TensorType(dt, (n, x.shape[1]))]


def _ref_spmv(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    n, m = _shape_attr("spmv", attrs)
    return [csr_dense(xs[0], xs[1], xs[2], n, m, "spmv") @ xs[3]]


def _cond_spmv(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    """``k`` = the longest row, ``scale`` = ``max (|A| |x|)`` (the summation bound)."""
    n, m = _shape_attr("spmv", attrs)
    counts = np.diff(np.asarray(refs[0], np.int64))
    a = np.abs(csr_dense(refs[0], refs[1], refs[2], n, m))
    mag = a @ np.abs(refs[3])
    return max(int(counts.max()) if counts.size else 1, 1), float(mag.max()) if mag.size else 0.0


def _sparse_flops(i: Sequence[TensorType], o: Sequence[TensorType], a: Attrs) -> float:
    nnz = i[2].shape[0]
    cols = i[3].shape[1] if len(i) > 3 and i[3].rank == 2 else 1
    return 2.0 * (nnz if isinstance(nnz, int) else 1) * (cols if isinstance(cols, int) else 1)


_CSR_IN = ("indptr", "indices", "values")

register_op(OpSchema(
    "spmv", (*_CSR_IN, "x"), _infer_spmv, _ref_spmv, attrs=(AttrSpec("shape", "ints", doc=SHAPE_DOC),),
    category="sparse", dtypes=SPARSE_VALUES, flops=_sparse_flops, accumulates=True,
    differentiable=False, cases=CaseSpec("spmv"), extra={"condition": _cond_spmv},
    doc="y = A @ x for a CSR matrix A (indptr, indices, values; shape=(n, m)) and x of (m,)"))

register_op(OpSchema(
    "spmm", (*_CSR_IN, "x"), _infer_spmm, _ref_spmv, attrs=(AttrSpec("shape", "ints", doc=SHAPE_DOC),),
    category="sparse", dtypes=SPARSE_VALUES, flops=_sparse_flops, accumulates=True,
    differentiable=False, cases=CaseSpec("spmm"), extra={"condition": _cond_spmv},
    doc="Y = A @ X for a CSR matrix A (indptr, indices, values; shape=(n, m)) and a dense X of (m, k)"))


def _infer_to_dense(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    n, m, dt = _check_csr("csr_to_dense", ts, attrs)
    return [TensorType(dt, (n, m))]


def _ref_to_dense(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    n, m = _shape_attr("csr_to_dense", attrs)
    return [csr_dense(xs[0], xs[1], xs[2], n, m, "csr_to_dense")]


def _cond_to_dense(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    """Duplicates add up: ``k`` = the most entries sharing one position."""
    n, m = _shape_attr("csr_to_dense", attrs)
    hits = csr_dense(refs[0], refs[1], np.ones(np.asarray(refs[1]).shape), n, m)
    mag = np.abs(csr_dense(refs[0], refs[1], np.abs(refs[2]), n, m))
    return max(int(hits.max()) if hits.size else 1, 1), float(mag.max()) if mag.size else 0.0


register_op(OpSchema(
    "csr_to_dense", _CSR_IN, _infer_to_dense, _ref_to_dense,
    attrs=(AttrSpec("shape", "ints", doc=SHAPE_DOC),), category="sparse", dtypes=SPARSE_VALUES,
    flops=lambda i, o, a: 0.0, accumulates=True, differentiable=False, cases=CaseSpec("csr_to_dense"),
    extra={"condition": _cond_to_dense},
    doc="the dense (n, m) matrix of a CSR matrix; duplicate entries add up (from dense to CSR is the "
        "host helper rlx_core.sparse.CSR.from_dense: its nnz depends on the data)"))


def _infer_csr_add(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _, _, da = _check_csr("csr_add", ts[:3], attrs)
    _, _, db = _check_csr("csr_add", ts[3:], attrs)
    if da != db:
        raise DTypeError(f"csr_add: values are {da} and {db}", fix="cast one operand's values")
    na, nb = ts[1].shape[0], ts[4].shape[0]
    if not (isinstance(na, int) and isinstance(nb, int)):
        raise ShapeError(f"csr_add needs static entry counts, got {na} and {nb}",
                         fix="specialize the graph (bind its symbols) first")
    nnz = na + nb
    if ts[0].dtype != ts[3].dtype:
        raise DTypeError(f"csr_add: index dtypes {ts[0].dtype} and {ts[3].dtype} differ",
                         fix="cast both patterns to i32 or to i64")
    return [ts[0], TensorType(ts[1].dtype, (nnz,)), TensorType(da, (nnz,))]


def _ref_csr_add(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    n, m = _shape_attr("csr_add", attrs)
    ra = csr_rows(xs[0], xs[1], n, m, "csr_add")
    rb = csr_rows(xs[3], xs[4], n, m, "csr_add")
    rows = np.concatenate([ra, rb])
    order = np.argsort(rows, kind="stable")  # row by row: a's entries, then b's
    return [np.asarray(xs[0]) + np.asarray(xs[3]), np.concatenate([xs[1], xs[4]])[order],
            np.concatenate([xs[2], xs[5]])[order]]


register_op(OpSchema(
    "csr_add", ("a_indptr", "a_indices", "a_values", "b_indptr", "b_indices", "b_values"),
    _infer_csr_add, _ref_csr_add, attrs=(AttrSpec("shape", "ints", doc=SHAPE_DOC),), num_outputs=3,
    category="sparse", dtypes=SPARSE_VALUES, flops=lambda i, o, a: 0.0, differentiable=False,
    accuracy="exact", cases=CaseSpec("csr_add"),
    doc="A + B of two CSR matrices of one shape, as the CSR matrix holding both patterns row by row "
        "(a's entries then b's; nnz_a + nnz_b entries, positions in both become duplicates, which add "
        "up): the output size stays static. Scale a CSR matrix with mul on its values"))


# -- iterative solvers -------------------------------------------------------------------------

def _infer_iterative(op: str) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        n, m, dt = _check_csr(op, ts, attrs, FLOATS)
        b = ts[3]
        if n != m:
            raise ShapeError(f"{op}: the matrix is {n}x{m}", fix=f"{op} solves square systems")
        if b.dtype != dt or b.rank != 1 or (isinstance(b.shape[0], int) and b.shape[0] != n):
            raise ShapeError(f"{op}: b is {b.dtype}{b.shape}, needs {dt}({n},)",
                             fix="b is a vector of the values' dtype with one entry per row")
        if int(attrs["max_iter"]) < 0 or float(attrs["tol"]) < 0:  # type: ignore[arg-type]
            raise IRError(f"{op}: max_iter and tol must be >= 0", fix="pass max_iter >= 0, tol >= 0")
        return [b]
    return infer


def cg_reference(a: Any, b: np.ndarray, max_iter: int, tol: float, jacobi: bool) -> np.ndarray:
    """Preconditioned conjugate gradient from x0 = 0 in ``b``'s dtype; ``a`` is anything with ``@``.
    Stops when ``|r| <= tol * |b|`` (SciPy's ``rtol``) or after ``max_iter`` iterations, or on an
    exact breakdown (a zero curvature). The algorithm every backend implements."""
    x = np.zeros_like(b)
    r = b.copy()
    dinv = None
    if jacobi:
        d = np.asarray(a.diagonal() if hasattr(a, "diagonal") else np.diag(a))
        dinv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 1).astype(b.dtype)
    bound = tol * float(np.linalg.norm(b))
    if float(np.linalg.norm(r)) <= bound:
        return x
    z = r * dinv if dinv is not None else r
    p = z.copy()
    rz = np.vdot(r, z)
    for _ in range(max_iter):
        q = a @ p
        pq = np.vdot(p, q)
        if pq == 0:
            break
        alpha = rz / pq
        x += alpha * p
        r -= alpha * q
        if float(np.linalg.norm(r)) <= bound:
            break
        z = r * dinv if dinv is not None else r
        rz_new = np.vdot(r, z)
        if rz == 0:
            break
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def bicgstab_reference(a: Any, b: np.ndarray, max_iter: int, tol: float, jacobi: bool,
                       xp: Any = np) -> np.ndarray:
    """Right-preconditioned BiCGSTAB from x0 = 0 (shadow residual ``b``), stopping as :func:`cg_reference`.

    ``xp``: the array module of ``a`` and ``b`` (NumPy; CuPy runs the same loop on the GPU)."""
    x = xp.zeros_like(b)
    r = b.copy()
    dinv = None
    if jacobi:
        d = xp.asarray(a.diagonal() if hasattr(a, "diagonal") else xp.diag(a))
        dinv = xp.where(d != 0, 1.0 / xp.where(d != 0, d, 1), 1).astype(b.dtype)
    bound = tol * float(xp.linalg.norm(b))
    if float(xp.linalg.norm(r)) <= bound:
        return x
    rhat = r.copy()
    rho = alpha = omega = 1.0
    v = np.zeros_like(b)
    p = np.zeros_like(b)
    for _ in range(max_iter):
        rho_new = np.vdot(rhat, r)
        if rho_new == 0 or omega == 0:
            break
        beta = (rho_new / rho) * (alpha / omega)
        rho = rho_new
        p = r + beta * (p - omega * v)
        ph = p * dinv if dinv is not None else p
        v = a @ ph
        rv = np.vdot(rhat, v)
        if rv == 0:
            break
        alpha = rho / rv
        s = r - alpha * v
        if float(np.linalg.norm(s)) <= bound:
            x += alpha * ph
            break
        sh = s * dinv if dinv is not None else s
        t = a @ sh
        tt = np.vdot(t, t)
        omega = np.vdot(t, s) / tt if tt != 0 else 0.0
        x += alpha * ph + omega * sh
        r = s - omega * t
        if float(np.linalg.norm(r)) <= bound:
            break
    return x


def _ref_iterative(fn: Any, op: str) -> Any:
    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        n, m = _shape_attr(op, attrs)
        a = csr_dense(xs[0], xs[1], xs[2], n, m, op)
        return [fn(a, np.asarray(xs[3], np.float64), int(attrs["max_iter"]),  # type: ignore[arg-type]
                   float(attrs["tol"]), attrs["precond"] == "jacobi")]  # type: ignore[arg-type]
    return ref


def _cond_sparse_system(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    n, m = _shape_attr("solver", attrs)
    a = csr_dense(refs[0], refs[1], refs[2], n, m)
    x = np.linalg.lstsq(a, refs[3], rcond=None)[0] if n else np.zeros(0)
    return int(8 * max(n, 1) * _kappa(a)), _maxabs(x)


def _solver_attrs(max_iter: int) -> tuple[AttrSpec, ...]:
    return (AttrSpec("shape", "ints", doc=SHAPE_DOC),
            AttrSpec("max_iter", "int", default=max_iter, doc="iteration limit (>= 0)"),
            AttrSpec("tol", "float", default=1e-5, doc="stop when |b - A x| <= tol * |b| (SciPy's rtol)"),
            AttrSpec("precond", "str", default="none", choices=PRECONDITIONERS,
                     doc="none or jacobi (diagonal scaling; a zero diagonal entry counts as 1)"))


register_op(OpSchema(
    "cg", (*_CSR_IN, "b"), _infer_iterative("cg"), _ref_iterative(cg_reference, "cg"),
    attrs=_solver_attrs(1000), category="linalg", dtypes=FLOATS, differentiable=False,
    flops=lambda i, o, a: 2.0 * float(a["max_iter"]) * _sparse_flops(i, o, a),  # type: ignore[arg-type]
    accumulates=True, cases=CaseSpec("sparse_solver"), extra={"condition": _cond_sparse_system},
    doc="conjugate gradient for a symmetric positive definite CSR matrix: x ~ A^-1 b from x0 = 0, "
        "stopping at |r| <= tol |b| or max_iter; precond='jacobi' scales by the inverse diagonal"))

register_op(OpSchema(
    "bicgstab", (*_CSR_IN, "b"), _infer_iterative("bicgstab"),
    _ref_iterative(bicgstab_reference, "bicgstab"), attrs=_solver_attrs(1000), category="linalg",
    dtypes=FLOATS, differentiable=False,
    flops=lambda i, o, a: 4.0 * float(a["max_iter"]) * _sparse_flops(i, o, a),  # type: ignore[arg-type]
    accumulates=True, cases=CaseSpec("sparse_solver"), extra={"condition": _cond_sparse_system},
    doc="BiCGSTAB for a general square CSR matrix (x0 = 0, shadow residual b), stopping as cg; "
        "precond='jacobi' is right Jacobi preconditioning"))


def _infer_sparse_solve(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    n, m, dt = _check_csr("sparse_solve", ts, attrs, FLOATS)
    b = ts[3]
    if n != m:
        raise ShapeError(f"sparse_solve: the matrix is {n}x{m}", fix="sparse_solve solves square systems")
    if b.dtype != dt or b.rank not in (1, 2) or (isinstance(b.shape[0], int) and b.shape[0] != n):
        raise ShapeError(f"sparse_solve: b is {b.dtype}{b.shape}, needs {dt}({n},) or ({n}, k)",
                         fix="b has one row per matrix row")
    return [b]


def _ref_sparse_solve(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    n, m = _shape_attr("sparse_solve", attrs)
    a = csr_dense(xs[0], xs[1], xs[2], n, m, "sparse_solve")
    return [np.linalg.solve(a, xs[3]) if n else np.zeros_like(xs[3])]


register_op(OpSchema(
    "sparse_solve", (*_CSR_IN, "b"), _infer_sparse_solve, _ref_sparse_solve,
    attrs=(AttrSpec("shape", "ints", doc=SHAPE_DOC),), category="linalg", dtypes=FLOATS,
    differentiable=False, accumulates=True, cases=CaseSpec("sparse_solve"),
    extra={"condition": _cond_sparse_system},
    doc="x = A^-1 b by a sparse LU factorization (SuperLU, cuDSS...) of a square CSR matrix; b is "
        "(n,) or (n, k)"))


# -- dense: solve, cholesky, lu, qr, eigh, svd, lstsq ------------------------------------------

def _square(op: str, t: TensorType) -> None:
    if t.dtype not in FLOATS:
        raise DTypeError(f"{op} does not accept {t.dtype}", fix=f"{op} accepts f32 and f64; cast first")
    if t.rank < 2 or t.shape[-1] != t.shape[-2]:
        raise ShapeError(f"{op} needs square matrices (..., n, n), got {t.shape}",
                         fix="pass a batch of square matrices")


def _infer_solve(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a, b = ts
    _square("solve", a)
    if b.dtype != a.dtype:
        raise DTypeError(f"solve: a is {a.dtype}, b is {b.dtype}", fix="cast b to a's dtype")
    if b.rank == 1 and a.rank == 2:
        ok = b.shape[0] == a.shape[-1]
    else:
        ok = b.rank == a.rank and b.shape[:-2] == a.shape[:-2] and b.shape[-2] == a.shape[-1]
    if not ok:
        raise ShapeError(f"solve: b {b.shape} does not fit a {a.shape}",
                         fix="b is (n,) for one matrix, or (..., n, k) with a's batch dims")
    return [b]


def _ref_solve(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    a, b = xs
    if a.shape[-1] == 0 or b.size == 0:
        return [np.zeros_like(b)]
    return [np.linalg.solve(a, b)]


def _cond_solve(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    n = a.shape[-1]
    return int(8 * max(n, 1) * _kappa(a)), _maxabs(_ref_solve(refs, attrs)[0])


def _mtr(b: Any, t: Any) -> Any:
    perm = tuple(range(t.rank - 2)) + (t.rank - 1, t.rank - 2)
    return b.op("transpose", t, perm=perm)


def _outer_or_mm(b: Any, u: Any, v: Any) -> Any:
    """``u v^T`` for vectors, ``u @ v^T`` for matrices (the shape of solve's a-cotangent)."""
    if u.rank == 1:
        n = u.shape[0]
        return b.op("matmul", b.op("reshape", u, shape=(n, 1)), b.op("reshape", v, shape=(1, n)))
    return b.op("matmul", u, _mtr(b, v))


def _solve_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None:
        return [None, None]
    a = ins[0]
    gb = b.op("solve", _mtr(b, a), g)
    return [b.op("neg", _outer_or_mm(b, gb, outs[0])), gb]


def _solve_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    da, db = ts
    if da is None and db is None:
        return [None]
    rhs = db
    if da is not None:
        x = outs[0]
        ax = b.op("reshape", b.op("matmul", da, b.op("reshape", x, shape=(x.shape[0], 1))),
                  shape=x.shape) if x.rank == 1 else b.op("matmul", da, x)
        rhs = b.op("neg", ax) if rhs is None else rhs - ax
    return [b.op("solve", ins[0], rhs)]


register_op(OpSchema(
    "solve", ("a", "b"), _infer_solve, _ref_solve, category="linalg", dtypes=FLOATS,
    flops=lambda i, o, a: 2.0 / 3.0 * float(i[0].numel()) ** 1.5 + 2.0 * float(o[0].numel()) * 4,
    accumulates=True, vjp=_solve_vjp, jvp=_solve_jvp, cases=CaseSpec("solve"),
    extra={"condition": _cond_solve},
    doc="x = a^-1 b (LU with partial pivoting); a is (..., n, n), b is (n,) for one matrix or "
        "(..., n, k) with a's batch dims"))


def _infer_cholesky(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _square("cholesky", ts[0])
    return [ts[0]]


def _ref_cholesky(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    a = xs[0]
    if a.shape[-1] == 0:
        return [np.zeros_like(a)]
    try:
        return [np.linalg.cholesky(a)]
    except np.linalg.LinAlgError:
        raise InputError("cholesky: a matrix is not positive definite",
                         fix="pass symmetric positive definite matrices") from None


def _cond_cholesky(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    return int(8 * max(a.shape[-1], 1) * _kappa(a)), _maxabs(np.sqrt(np.abs(a)))


def _tril_phi(b: Any, n: int, dt: DType) -> Any:
    """The constant mask of Phi: 1 below the diagonal, 1/2 on it, 0 above."""
    return b.const(np.tril(np.ones((n, n))) - 0.5 * np.eye(n), dt)


def _cholesky_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    # Murray (2016): ga = sym(L^-T Phi(L^T gL) L^-1), Phi = lower triangle with half the diagonal.
    g = cts[0]
    if g is None:
        return [None]
    lo = outs[0]
    n = int(lo.shape[-1])
    lt = _mtr(b, lo)
    p = b.op("matmul", lt, g) * _tril_phi(b, n, lo.dtype)
    z = b.op("solve", lt, p)                      # L^-T P
    m = _mtr(b, b.op("solve", lt, _mtr(b, z)))  # L^-T P L^-1
    return [(m + _mtr(b, m)) * b.const(0.5, lo.dtype)]


def _cholesky_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    # dL = L Phi(L^-1 dA L^-T)
    da = ts[0]
    if da is None:
        return [None]
    lo = outs[0]
    n = int(lo.shape[-1])
    y = b.op("solve", lo, da)                   # L^-1 dA
    s = _mtr(b, b.op("solve", lo, _mtr(b, y)))  # L^-1 dA L^-T
    return [b.op("matmul", lo, s * _tril_phi(b, n, lo.dtype))]


register_op(OpSchema(
    "cholesky", ("a",), _infer_cholesky, _ref_cholesky, category="linalg", dtypes=FLOATS,
    flops=lambda i, o, a: float(i[0].numel()) ** 1.5 / 3.0, accumulates=True,
    vjp=_cholesky_vjp, jvp=_cholesky_jvp, cases=CaseSpec("cholesky"),
    extra={"condition": _cond_cholesky},
    doc="lower-triangular L with a = L L^T for symmetric positive definite a (..., n, n); reads the "
        "lower triangle; a matrix that is not positive definite is an InputError where the backend checks "
        "(cpu), else the result is unspecified"))


def lu_reference(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``a = p @ l @ u`` by Gaussian elimination with partial pivoting (the first largest |pivot|
    wins, as LAPACK's getrf), one matrix."""
    n = a.shape[0]
    u = np.array(a, copy=True)
    lo = np.eye(n, dtype=a.dtype)
    perm = np.arange(n)
    for k in range(n - 1):
        piv = k + int(np.argmax(np.abs(u[k:, k])))
        if piv != k:
            u[[k, piv], :] = u[[piv, k], :]
            lo[[k, piv], :k] = lo[[piv, k], :k]
            perm[[k, piv]] = perm[[piv, k]]
        if u[k, k] != 0:
            f = u[k + 1:, k] / u[k, k]
            lo[k + 1:, k] = f
            u[k + 1:, k:] -= np.outer(f, u[k, k:])
        u[k + 1:, k] = 0
    p = np.zeros((n, n), a.dtype)
    p[perm, np.arange(n)] = 1
    return p, lo, np.triu(u)


def _infer_lu(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _square("lu", ts[0])
    return [ts[0], ts[0], ts[0]]


def _batched(fn: Any, a: np.ndarray, n_out: int) -> list[np.ndarray]:
    lead = a.shape[:-2]
    if a.size == 0:  # only lu batches through here: its outputs have a's shape
        return [np.zeros(a.shape, a.dtype) for _ in range(n_out)]
    res = [fn(m) for m in a.reshape((-1, *a.shape[-2:]))]
    return [np.stack([r[i] for r in res]).reshape(lead + res[0][i].shape) for i in range(n_out)]


def _cond_lu(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    return int(8 * max(a.shape[-1], 1) * _kappa(a)), _maxabs(a)


def _ref_lu(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return _batched(lu_reference, xs[0], 3)


register_op(OpSchema(
    "lu", ("a",), _infer_lu, _ref_lu, num_outputs=3, category="linalg", dtypes=FLOATS,
    flops=lambda i, o, a: 2.0 / 3.0 * float(i[0].numel()) ** 1.5, accumulates=True,
    differentiable=False, cases=CaseSpec("lu"), extra={"condition": _cond_lu},
    doc="a = p @ l @ u with partial pivoting (LAPACK getrf's pivots): p a permutation matrix, l unit "
        "lower triangular, u upper triangular; a is (..., n, n)"))


def _infer_qr(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a = ts[0]
    if a.dtype not in FLOATS or a.rank < 2:
        raise DTypeError(f"qr needs f32/f64 matrices (..., m, n), got {a}", fix="cast or reshape")
    m, n = a.shape[-2], a.shape[-1]
    if isinstance(m, int) and isinstance(n, int):
        k: Dim = min(m, n)
    elif m == n:
        k = m
    else:
        raise ShapeError(f"qr needs static m, n, got {a.shape}", fix="specialize the graph first")
    return [TensorType(a.dtype, (*a.shape[:-1], k)), TensorType(a.dtype, (*a.shape[:-2], k, n))]


def qr_reference(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced QR with ``diag(r) >= 0`` (unique for full-rank a)."""
    q, r = np.linalg.qr(a, mode="reduced")
    d = np.diagonal(r, axis1=-2, axis2=-1)
    s = np.where(d < 0, -1.0, 1.0).astype(a.dtype)
    return q * s[..., None, :], r * s[..., :, None]


def _cond_qr(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    return int(8 * max(*a.shape[-2:], 1) * _kappa(a)), _maxabs(a)


register_op(OpSchema(
    "qr", ("a",), _infer_qr, lambda xs, at: list(qr_reference(xs[0])), num_outputs=2,
    category="linalg", dtypes=FLOATS, accumulates=True, differentiable=False, cases=CaseSpec("qr"),
    flops=lambda i, o, a: 2.0 * float(i[0].numel()) * float(_int(o[1].shape[-2])),
    extra={"condition": _cond_qr},
    doc="reduced QR of a (..., m, n): q (..., m, k) with orthonormal columns, r (..., k, n) upper "
        "triangular with diag(r) >= 0, k = min(m, n)"))


def sign_fix(v: np.ndarray) -> np.ndarray:
    """Per column (last axis), +1 or -1 making the largest-magnitude entry (the first on ties) positive."""
    if v.shape[-2] == 0:
        return np.ones(v.shape[:-2] + v.shape[-1:], v.dtype)
    i = np.argmax(np.abs(v), axis=-2)
    pick = np.take_along_axis(v, i[..., None, :], axis=-2)[..., 0, :]
    return np.where(pick < 0, -1.0, 1.0).astype(v.dtype)


def _infer_eigh(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a = ts[0]
    _square("eigh", a)
    return [TensorType(a.dtype, a.shape[:-1]), a]


def eigh_reference(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, v = np.linalg.eigh(a)
    return w, v * sign_fix(v)[..., None, :]


def _gap(w: np.ndarray) -> float:
    """The smallest distance between two eigen/singular values of one matrix (inf if fewer than 2)."""
    if w.shape[-1] < 2:
        return float("inf")
    s = np.sort(w, axis=-1)
    return float(np.min(np.diff(s, axis=-1)))


def _cond_eigh(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    n = a.shape[-1]
    if a.size == 0:
        return 1, 1.0
    w = np.linalg.eigvalsh(a)
    norm = _maxabs(w)
    return int(8 * max(n, 1) * max(1.0, norm / max(_gap(w), 1e-300))), norm


def _eye_mask(b: Any, n: int) -> Any:
    return b.const(np.eye(n, dtype=bool), DType.BOOL)


def _eigh_f(b: Any, w: Any) -> Any:
    """F[i, j] = 1 / (w_j - w_i) off the diagonal, 0 on it."""
    n = int(w.shape[-1])
    lead = tuple(w.shape[:-1])
    d = b.op("reshape", w, shape=(*lead, 1, n)) - b.op("reshape", w, shape=(*lead, n, 1))
    eye = _eye_mask(b, n)
    one, zero = b.const(1.0, w.dtype), b.const(0.0, w.dtype)
    safe = b.op("where", eye, one, d)
    return b.op("where", eye, zero, b.op("div", one, safe))


def _diag_embed(b: Any, w: Any) -> Any:
    n = int(w.shape[-1])
    lead = tuple(w.shape[:-1])
    return b.op("reshape", w, shape=(*lead, 1, n)) * b.const(np.eye(n), w.dtype)


def _eigh_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    # ga = V (diag(gw) + F o (V^T gV)) V^T, symmetrized (only a's symmetric part is read).
    gw, gv = cts
    if gw is None and gv is None:
        return [None]
    w, v = outs
    inner = None
    if gw is not None:
        inner = _diag_embed(b, gw)
    if gv is not None:
        t = b.op("matmul", _mtr(b, v), gv) * _eigh_f(b, w)
        inner = t if inner is None else inner + t
    ga = b.op("matmul", b.op("matmul", v, inner), _mtr(b, v))
    return [(ga + _mtr(b, ga)) * b.const(0.5, w.dtype)]


def _eigh_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    # dw = diag(V^T dA V), dV = V (F o (V^T dA V))
    da = ts[0]
    if da is None:
        return [None, None]
    w, v = outs
    n = int(w.shape[-1])
    m = b.op("matmul", b.op("matmul", _mtr(b, v), da), v)
    dw = b.op("reduce_sum", m * b.const(np.eye(n), w.dtype), axes=(m.rank - 1,), keepdims=False)
    return [dw, b.op("matmul", v, m * _eigh_f(b, w))]


register_op(OpSchema(
    "eigh", ("a",), _infer_eigh, lambda xs, at: list(eigh_reference(xs[0])), num_outputs=2,
    category="linalg", dtypes=FLOATS, accumulates=True, vjp=_eigh_vjp, jvp=_eigh_jvp,
    flops=lambda i, o, a: 9.0 * float(i[0].numel()) ** 1.5, cases=CaseSpec("eigh"),
    extra={"condition": _cond_eigh},
    doc="eigenvalues w (ascending) and eigenvectors v (columns) of symmetric a (..., n, n), reading "
        "its lower triangle; each eigenvector's largest-magnitude component is positive"))


def _infer_svd(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a = ts[0]
    if a.dtype not in FLOATS or a.rank < 2:
        raise DTypeError(f"svd needs f32/f64 matrices (..., m, n), got {a}", fix="cast or reshape")
    m, n = a.shape[-2], a.shape[-1]
    if not (isinstance(m, int) and isinstance(n, int)):
        raise ShapeError(f"svd needs static m, n, got {a.shape}", fix="specialize the graph first")
    k = min(m, n)
    lead = a.shape[:-2]
    return [TensorType(a.dtype, (*lead, m, k)), TensorType(a.dtype, (*lead, k)),
            TensorType(a.dtype, (*lead, k, n))]


def svd_reference(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    f = sign_fix(u)
    return u * f[..., None, :], s, vh * f[..., :, None]


def _cond_svd(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    if a.size == 0:
        return 1, 1.0
    s = np.linalg.svd(a, compute_uv=False)
    norm = _maxabs(s)
    gap = _gap(s)
    if a.shape[-1] != a.shape[-2]:
        gap = min(gap, float(np.min(s)))  # reduced vectors of a rectangular a also depend on s_min
    return int(8 * max(*a.shape[-2:], 1) * max(1.0, norm / max(gap, 1e-300))), norm


register_op(OpSchema(
    "svd", ("a",), _infer_svd, lambda xs, at: list(svd_reference(xs[0])), num_outputs=3,
    category="linalg", dtypes=FLOATS, accumulates=True, differentiable=False, cases=CaseSpec("svd"),
    flops=lambda i, o, a: 12.0 * float(i[0].numel()) ** 1.5, extra={"condition": _cond_svd},
    doc="reduced SVD a = u diag(s) vh of a (..., m, n): s descending, k = min(m, n); each column of u "
        "has its largest-magnitude entry positive (vh's rows follow)"))


def _infer_lstsq(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a, b = ts
    if a.dtype not in FLOATS or b.dtype != a.dtype:
        raise DTypeError(f"lstsq needs f32/f64 a and b of one dtype, got {a.dtype}, {b.dtype}",
                         fix="cast both")
    if a.rank != 2 or b.rank not in (1, 2) or b.shape[0] != a.shape[0]:
        raise ShapeError(f"lstsq: a {a.shape} and b {b.shape} do not fit",
                         fix="a is (m, n), b is (m,) or (m, k)")
    return [TensorType(a.dtype, (a.shape[1], *b.shape[1:]))]


def _ref_lstsq(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    a, b = xs
    if a.size == 0:
        return [np.zeros((a.shape[1], *b.shape[1:]), np.float64)]
    return [np.linalg.lstsq(a, b, rcond=None)[0]]


def _cond_lstsq(refs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    a = refs[0]
    k = _kappa(a)
    return int(8 * max(*a.shape, 1) * k * k), _maxabs(_ref_lstsq(refs, attrs)[0])


register_op(OpSchema(
    "lstsq", ("a", "b"), _infer_lstsq, _ref_lstsq, category="linalg", dtypes=FLOATS,
    accumulates=True, differentiable=False, cases=CaseSpec("lstsq"), extra={"condition": _cond_lstsq},
    flops=lambda i, o, a: 4.0 * float(i[0].numel()) * float(_int(i[0].shape[1])),
    doc="the minimum-norm least-squares solution x of a x ~ b (LAPACK gelsd, rcond = eps * max(m, n)); "
        "a is (m, n), b (m,) or (m, k)"))


#: Every linear algebra op, for claims and documentation.
LINALG_OPS: tuple[str, ...] = ("spmv", "spmm", "csr_to_dense", "csr_add", "cg", "bicgstab", "sparse_solve",
                               "solve", "cholesky", "lu", "qr", "eigh", "svd", "lstsq")

__all__ = ["FLOATS", "LINALG_OPS", "PRECONDITIONERS", "SPARSE_VALUES", "bicgstab_reference", "cg_reference",
           "csr_dense", "csr_rows", "eigh_reference", "lu_reference", "qr_reference", "sign_fix",
           "svd_reference"]
