"""Conformance cases for the linear algebra ops (``rlx_core.ir.ops.linalg``), by case family; part
of :data:`rlx_conformance.cases.GENERATORS`.

Sparse cases cover what breaks CSR kernels: i32 and i64 index operands, unsorted columns and
duplicate entries (which add up), empty rows (the last one too), a matrix without entries, empty
shapes and strided operands. Solver and factorization cases use well-conditioned matrices built
from their spectrum (SPD, diagonally dominant, separated eigen/singular values), so the float64
reference is a sharp oracle; tolerances scale with the condition number (the op's
``extra["condition"]``). Iterative solvers run with ``tol=0`` and a fixed iteration budget: every
backend then performs the same iterations, and the result is the solution to rounding.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.plugin import DType

Arr = Callable[[np.random.Generator], np.ndarray]


def _const(a: np.ndarray) -> Arr:
    def make(rng: np.random.Generator) -> np.ndarray:
        return np.array(a, copy=True)
    return make


def _strided(a: np.ndarray) -> Arr:
    """The same values as a non-contiguous view (every other element of a buffer twice as long)."""
    def make(rng: np.random.Generator) -> np.ndarray:
        if a.ndim >= 2:
            return np.ascontiguousarray(a.T).T  # column-major: transposed strides
        buf = np.zeros(2 * a.shape[0], a.dtype)
        buf[::2] = a
        return buf[::2]
    return make


def _rng(c: Any, label: str) -> np.random.Generator:
    return np.random.default_rng(c.seed + zlib.crc32(f"{c.op}[{c.dtype}]-{label}".encode()))


def _vals(rng: np.random.Generator, shape: Any, dt: DType) -> np.ndarray:
    x = rng.uniform(-1.0, 1.0, shape)
    if dt.is_complex:
        x = x + 1j * rng.uniform(-1.0, 1.0, shape)
    return x.astype(dt.np)


def random_csr(rng: np.random.Generator, n: int, m: int, density: float, dt: DType, index: DType, *,
               unsorted: bool = False, dups: bool = False, empty_rows: tuple[int, ...] = ()
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSR triple of an ``n`` x ``m`` random matrix."""
    rows: list[np.ndarray] = []
    for i in range(n):
        if i in empty_rows or m == 0:
            cols = np.zeros(0, np.int64)
        else:
            cols = np.flatnonzero(rng.random(m) < density)
            if dups and cols.size:
                cols = np.concatenate([cols, rng.choice(cols, size=min(2, cols.size))])
            cols = rng.permutation(cols) if unsorted else np.sort(cols)
        rows.append(cols)
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])]).astype(index.np)
    indices = (np.concatenate(rows) if rows else np.zeros(0)).astype(index.np)
    return indptr, indices, _vals(rng, indices.shape, dt)


def _csr_inputs(t: tuple[np.ndarray, np.ndarray, np.ndarray], prefix: str = "") -> list[tuple[str, Arr]]:
    return [(f"{prefix}indptr", _const(t[0])), (f"{prefix}indices", _const(t[1])),
            (f"{prefix}values", _const(t[2]))]


def _csr_of_dense(a: np.ndarray, index: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, col = np.nonzero(a)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=a.shape[0]))]).astype(index.np)
    return indptr, col.astype(index.np), a[r, col]


# -- sparse ------------------------------------------------------------------------------------

def _sparse_matrix_cases(c: Any, operand: Callable[[np.random.Generator, int], np.ndarray] | None) -> None:
    dt, i32, i64 = c.dtype, DType.I32, DType.I64
    specs: list[tuple[str, str, int, int, dict[str, Any], DType]] = [
        ("basic", "basic", 5, 7, {}, i32),
        ("i64", "basic", 6, 4, {}, i64),
        ("unsorted_dups", "basic", 6, 6, {"unsorted": True, "dups": True}, i32),
        ("empty_rows", "basic", 6, 5, {"empty_rows": (0, 3, 5)}, i64),
        ("no_entries", "size0", 4, 3, {"empty_rows": (0, 1, 2, 3)}, i32),
        ("size0_rows", "size0", 0, 3, {}, i32),
        ("size0_cols", "size0", 3, 0, {}, i64),
        ("large", "large", 200, 300, {"unsorted": True}, i32),  # the Numba path (>= 16384 entries)
    ]
    for label, kind, n, m, kw, index in specs:
        rng = _rng(c, label)
        csr = random_csr(rng, n, m, 0.35, dt, index, **kw)
        ins = _csr_inputs(csr)
        if operand is not None:
            ins.append(("x", _const(operand(rng, m))))
        c.add(label, kind, ins, {"shape": (n, m)})
    if operand is not None:
        rng = _rng(c, "noncontiguous")
        csr = random_csr(rng, 5, 6, 0.4, dt, i32, unsorted=True)
        c.add("noncontiguous", "noncontiguous", [*_csr_inputs(csr), ("x", _strided(operand(rng, 6)))],
              {"shape": (5, 6)})


def gen_spmv(c: Any) -> None:
    _sparse_matrix_cases(c, lambda rng, m: _vals(rng, (m,), c.dtype))


def gen_spmm(c: Any) -> None:
    _sparse_matrix_cases(c, lambda rng, m: _vals(rng, (m, 3), c.dtype))


def gen_csr_to_dense(c: Any) -> None:
    _sparse_matrix_cases(c, None)


def gen_csr_add(c: Any) -> None:
    dt = c.dtype
    specs: list[tuple[str, str, int, int, DType, dict[str, Any]]] = [
        ("basic", "basic", 5, 6, DType.I32, {}),
        ("i64_unsorted", "basic", 4, 7, DType.I64, {"unsorted": True}),
        ("empty_rows", "basic", 5, 4, DType.I32, {"empty_rows": (1, 4)}),
        ("size0", "size0", 0, 3, DType.I64, {})]
    for label, kind, n, m, index, kw in specs:
        rng = _rng(c, label)
        a = random_csr(rng, n, m, 0.4, dt, index, **kw)
        b = random_csr(rng, n, m, 0.3, dt, index, dups=True)
        c.add(label, kind, [*_csr_inputs(a, "a_"), *_csr_inputs(b, "b_")], {"shape": (n, m)})


def _dominant(rng: np.random.Generator, n: int, *, symmetric: bool, density: float = 0.35) -> np.ndarray:
    """A sparse, diagonally dominant matrix (SPD when symmetric): condition number O(1)."""
    a = np.where(rng.random((n, n)) < density, rng.uniform(-1.0, 1.0, (n, n)), 0.0)
    np.fill_diagonal(a, 0.0)
    if symmetric:
        a = a + a.T
    np.fill_diagonal(a, np.abs(a).sum(axis=1) + rng.uniform(0.5, 2.0, n))
    return a


def gen_sparse_solver(c: Any) -> None:
    """cg (SPD) and bicgstab (nonsymmetric) with a fixed budget of iterations and ``tol=0``."""
    dt, sym = c.dtype, c.op == "cg"
    for label, kind, n, index, extra in [("basic", "basic", 8, DType.I32, {}),
                                         ("jacobi", "basic", 10, DType.I64, {"precond": "jacobi"}),
                                         ("larger", "large", 30, DType.I32, {"precond": "jacobi"}),
                                         ("zero_rhs", "basic", 5, DType.I32, {})]:
        rng = _rng(c, label)
        a = _dominant(rng, n, symmetric=sym)
        if label == "larger":
            a *= 1e3  # the scaling Jacobi undoes; the solution is ~1e-3
        b = np.zeros(n) if label == "zero_rhs" else rng.uniform(-1.0, 1.0, n)
        attrs = {"shape": (n, n), "max_iter": 3 * n, "tol": 0.0, **extra}
        csr = _csr_of_dense(a.astype(dt.np), index)
        c.add(label, kind, [*_csr_inputs(csr), ("b", _const(b.astype(dt.np)))], attrs)
    rng = _rng(c, "converged")
    a = _dominant(rng, 6, symmetric=sym)
    c.add("tol_met", "basic", [*_csr_inputs(_csr_of_dense(a.astype(dt.np), DType.I32)),
                               ("b", _const(rng.uniform(-1.0, 1.0, 6).astype(dt.np)))],
          {"shape": (6, 6), "max_iter": 200, "tol": 1e-3})  # stops far from the bound: same iterations


def gen_sparse_solve(c: Any) -> None:
    dt = c.dtype
    for label, n, index, k in [("basic", 7, DType.I32, None), ("i64", 9, DType.I64, None),
                               ("matrix_rhs", 6, DType.I32, 3)]:
        rng = _rng(c, label)
        a = _dominant(rng, n, symmetric=False)
        b = rng.uniform(-1.0, 1.0, (n,) if k is None else (n, k))
        c.add(label, "basic", [*_csr_inputs(_csr_of_dense(a.astype(dt.np), index)),
                               ("b", _const(b.astype(dt.np)))], {"shape": (n, n)})


# -- dense -------------------------------------------------------------------------------------

def _well(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random square matrices (..., n, n) with condition number below ~10."""
    n = shape[-1]
    return rng.uniform(-1.0, 1.0, shape) + 2.0 * np.sqrt(max(n, 1)) * np.eye(n)


def _spd(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    m = rng.uniform(-1.0, 1.0, shape)
    n = shape[-1]
    return m @ np.swapaxes(m, -1, -2) + n * np.eye(n)


def _orth(rng: np.random.Generator, n: int, lead: tuple[int, ...] = ()) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((*lead, n, n)))
    return q


def gen_solve(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "solve")
    c.add("basic", "basic", [("a", _const(_well(rng, (5, 5)).astype(npdt))),
                             ("b", _const(rng.uniform(-1, 1, 5).astype(npdt)))])
    c.add("matrix_rhs", "basic", [("a", _const(_well(rng, (4, 4)).astype(npdt))),
                                  ("b", _const(rng.uniform(-1, 1, (4, 3)).astype(npdt)))])
    c.add("batched", "basic", [("a", _const(_well(rng, (2, 3, 3)).astype(npdt))),
                               ("b", _const(rng.uniform(-1, 1, (2, 3, 2)).astype(npdt)))])
    c.add("noncontiguous", "noncontiguous", [("a", _strided(_well(rng, (6, 6)).astype(npdt))),
                                             ("b", _strided(rng.uniform(-1, 1, 6).astype(npdt)))])
    c.add("size0", "size0", [("a", _const(np.zeros((0, 0), npdt))), ("b", _const(np.zeros(0, npdt)))])
    c.add("large", "large", [("a", _const(_well(rng, (40, 40)).astype(npdt))),
                             ("b", _const(rng.uniform(-1, 1, (40, 2)).astype(npdt)))])


def gen_cholesky(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "cholesky")
    c.add("basic", "basic", [("a", _const(_spd(rng, (5, 5)).astype(npdt)))])
    c.add("batched", "basic", [("a", _const(_spd(rng, (3, 4, 4)).astype(npdt)))])
    c.add("noncontiguous", "noncontiguous", [("a", _strided(_spd(rng, (6, 6)).astype(npdt)))])
    c.add("size1", "size1", [("a", _const(np.full((1, 1), 2.25, npdt)))])
    c.add("size0", "size0", [("a", _const(np.zeros((2, 0, 0), npdt)))])
    c.add("large", "large", [("a", _const(_spd(rng, (48, 48)).astype(npdt)))])


def gen_lu(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "lu")
    a = rng.uniform(-1, 1, (5, 5)) + 3 * np.eye(5)
    c.add("basic", "basic", [("a", _const(a.astype(npdt)))])
    c.add("pivoting", "basic", [("a", _const(_well(rng, (6, 6))[::-1].astype(npdt)))])
    c.add("batched", "basic", [("a", _const(_well(rng, (2, 4, 4)).astype(npdt)))])
    c.add("noncontiguous", "noncontiguous", [("a", _strided(_well(rng, (5, 5)).astype(npdt)))])
    c.add("size0", "size0", [("a", _const(np.zeros((0, 0), npdt)))])


def gen_qr(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "qr")
    for label, shape in [("square", (5, 5)), ("tall", (7, 4)), ("wide", (3, 6)), ("batched", (2, 5, 3))]:
        a = rng.uniform(-1, 1, shape)
        a[..., :min(shape[-2:]), :min(shape[-2:])] += 2 * np.eye(min(shape[-2:]))  # full rank
        c.add(label, "basic", [("a", _const(a.astype(npdt)))])
    c.add("noncontiguous", "noncontiguous", [("a", _strided(_well(rng, (4, 4)).astype(npdt)))])


def gen_eigh(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "eigh")
    for label, n, lead in [("basic", 5, ()), ("batched", 4, (2,)), ("size1", 1, ())]:
        q = _orth(rng, n, lead)
        w = np.arange(n) * 1.5 - 2.0 + rng.uniform(-0.2, 0.2, (*lead, n))  # gaps >= 1.1
        a = q @ (w[..., :, None] * np.swapaxes(q, -1, -2))
        a = (a + np.swapaxes(a, -1, -2)) / 2
        c.add(label, "size1" if n == 1 else "basic", [("a", _const(a.astype(npdt)))])
    q = _orth(rng, 6)
    a = q @ np.diag(np.arange(6.0) - 2.5) @ q.T
    c.add("noncontiguous", "noncontiguous", [("a", _strided(((a + a.T) / 2).astype(npdt)))])


def gen_svd(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "svd")
    for label, m, n, lead in [("square", 4, 4, ()), ("tall", 6, 3, ()), ("wide", 3, 5, ()),
                              ("batched", 4, 3, (2,))]:
        k = min(m, n)
        u = _orth(rng, m, lead)[..., :k]
        v = _orth(rng, n, lead)[..., :k]
        s = 1.0 + np.arange(k)[::-1] * 1.2 + rng.uniform(0, 0.1, (*lead, k))
        a = (u * s[..., None, :]) @ np.swapaxes(v, -1, -2)
        c.add(label, "basic", [("a", _const(a.astype(npdt)))])


def gen_lstsq(c: Any) -> None:
    npdt, rng = c.dtype.np, _rng(c, "lstsq")
    a = rng.uniform(-1, 1, (8, 4))
    a[:4] += 2 * np.eye(4)
    c.add("tall", "basic", [("a", _const(a.astype(npdt))), ("b", _const(rng.uniform(-1, 1, 8).astype(npdt)))])
    c.add("matrix_rhs", "basic", [("a", _const(a.astype(npdt))),
                                  ("b", _const(rng.uniform(-1, 1, (8, 2)).astype(npdt)))])
    w = rng.uniform(-1, 1, (3, 5))
    w[:, :3] += 2 * np.eye(3)
    c.add("wide_min_norm", "basic", [("a", _const(w.astype(npdt))),
                                     ("b", _const(rng.uniform(-1, 1, 3).astype(npdt)))])


GENERATORS: dict[str, Callable[[Any], None]] = {
    "spmv": gen_spmv, "spmm": gen_spmm, "csr_to_dense": gen_csr_to_dense, "csr_add": gen_csr_add,
    "sparse_solver": gen_sparse_solver, "sparse_solve": gen_sparse_solve, "solve": gen_solve,
    "cholesky": gen_cholesky, "lu": gen_lu, "qr": gen_qr, "eigh": gen_eigh, "svd": gen_svd,
    "lstsq": gen_lstsq,
}

__all__ = ["GENERATORS", "random_csr"]
