"""CSR matrices for users: load them (SciPy arrays, Matrix Market files, dense arrays) and use them
in graphs through the linear algebra ops (``rlx_core.ir.ops.linalg``).

In the IR a CSR matrix is its three arrays (``indptr``, ``indices``, ``values``) plus the static
``shape`` attribute of every sparse op, so a :class:`CSR` enters a graph as three inputs
(:meth:`CSR.inputs`, fed by :meth:`CSR.feed`) or three constants (:meth:`CSR.constants`)::

    a = CSR.read_matrix_market("poisson.mtx")           # or CSR.from_scipy(m), CSR.from_dense(d)
    g = GraphBuilder("solve")
    A = a.inputs(g, "A")
    b = g.input("b", a.dtype, (a.shape[0],))
    g.output(cg(g, A, b, tol=1e-8, precond="jacobi"), "x")
    x = Session("cpu").compile(g.build()).run({**a.feed("A"), "b": rhs})["x"]

Building a CSR from dense data is a host step (its number of entries depends on the values), and so
is reading files; everything else (products, sums, solves) is an op. SciPy is optional: only
:meth:`CSR.from_scipy` takes a SciPy array and :meth:`CSR.to_scipy` needs SciPy installed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import numpy as np

from .dtypes import DType
from .errors import DTypeError, SerializationError, ShapeError
from .ir.builder import GraphBuilder, Tensor

#: Value dtypes a CSR matrix may hold (complex128 data is stored as c64).
VALUE_DTYPES = (DType.F32, DType.F64, DType.C64)
_MM_FIELDS = ("real", "double", "integer", "complex", "pattern")
_MM_SYMMETRY = ("general", "symmetric", "skew-symmetric", "hermitian")


class SparseOperand(NamedTuple):
    """A CSR matrix inside a graph: its three tensors and its static shape."""

    indptr: Tensor
    indices: Tensor
    values: Tensor
    shape: tuple[int, int]


@dataclass(frozen=True)
class CSR:
    """A compressed-sparse-row matrix on the host: ``indptr`` (rows + 1 offsets), ``indices``
    (column per entry; unsorted columns and duplicates allowed, duplicates add up), ``values``."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        n, m = (int(d) for d in self.shape)
        ip = np.ascontiguousarray(self.indptr)
        ix = np.ascontiguousarray(self.indices)
        v = np.ascontiguousarray(self.values)
        if v.dtype == np.complex128:
            v = v.astype(np.complex64)
        if ip.dtype not in (np.int32, np.int64) or ix.dtype != ip.dtype:
            raise DTypeError(f"CSR index arrays are {ip.dtype} and {ix.dtype}",
                             fix="indptr and indices must both be int32 or both int64")
        if DType.parse(v.dtype) not in VALUE_DTYPES:
            raise DTypeError(f"CSR values are {v.dtype}", fix="use float32, float64 or complex64 values")
        if n < 0 or m < 0 or ip.shape != (n + 1,) or ix.ndim != 1 or v.shape != ix.shape:
            raise ShapeError(f"CSR arrays indptr {ip.shape}, indices {ix.shape}, values {v.shape} do not "
                             f"describe a {n}x{m} matrix",
                             fix="indptr has rows + 1 entries; one index per value")
        if ip[0] != 0 or ip[-1] != ix.size or (np.diff(ip) < 0).any():
            raise ShapeError("CSR indptr must rise from 0 to the number of entries",
                             fix="indptr[i]:indptr[i+1] are row i's entries")
        if ix.size and (int(ix.min()) < 0 or int(ix.max()) >= m):
            raise ShapeError(f"a CSR column index is outside [0, {m})", fix="columns count from 0")
        object.__setattr__(self, "indptr", ip)
        object.__setattr__(self, "indices", ix)
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "shape", (n, m))

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_dense(cls, a: Any, *, index_dtype: Any = np.int32, dtype: Any = None) -> CSR:
        """The nonzero entries of a 2-D array, by rows (sorted columns, no duplicates)."""
        arr = np.asarray(a) if dtype is None else np.asarray(a, dtype=dtype)
        if arr.ndim != 2:
            raise ShapeError(f"from_dense needs a 2-D array, got shape {arr.shape}", fix="reshape it")
        r, c = np.nonzero(arr)
        ip = np.zeros(arr.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(r, minlength=arr.shape[0]), out=ip[1:])
        return cls(ip.astype(index_dtype), c.astype(index_dtype), arr[r, c], arr.shape)

    @classmethod
    def from_scipy(cls, m: Any, *, index_dtype: Any = None, dtype: Any = None) -> CSR:
        """From any SciPy sparse array or matrix (converted with its ``tocsr()``)."""
        if not hasattr(m, "tocsr"):
            raise DTypeError(f"from_scipy needs a SciPy sparse array, got {type(m).__name__}",
                             fix="pass a scipy.sparse array, or use CSR.from_dense")
        c = m.tocsr()
        ip, ix = np.asarray(c.indptr), np.asarray(c.indices)
        if index_dtype is not None:
            ip, ix = ip.astype(index_dtype), ix.astype(index_dtype)
        elif ix.dtype != ip.dtype:
            ip, ix = ip.astype(np.int64), ix.astype(np.int64)
        v = np.asarray(c.data) if dtype is None else np.asarray(c.data, dtype=dtype)
        return cls(ip, ix, v, tuple(c.shape))

    @classmethod
    def read_matrix_market(cls, source: str | os.PathLike[str] | IO[str], *, dtype: Any = None,
                           index_dtype: Any = None) -> CSR:
        """Parse a Matrix Market file (``coordinate`` or ``array``; ``real``/``integer``/``complex``/
        ``pattern``; ``general``/``symmetric``/``skew-symmetric``/``hermitian``) without SciPy.
        Values are float64 (complex64 for complex files) unless ``dtype`` says otherwise."""
        if isinstance(source, (str, os.PathLike)):
            with open(source, encoding="ascii", errors="strict") as f:
                return _read_mm(f, str(source), dtype, index_dtype)
        return _read_mm(source, getattr(source, "name", "<stream>"), dtype, index_dtype)

    # -- use -----------------------------------------------------------------------------------

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def dtype(self) -> DType:
        return DType.parse(self.values.dtype)

    @property
    def index_dtype(self) -> DType:
        return DType.parse(self.indptr.dtype)

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, self.values.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        np.add.at(out, (rows, self.indices.astype(np.int64)), self.values)
        return out

    def to_scipy(self) -> Any:
        try:
            import scipy.sparse as sp
        except ImportError:
            raise ImportError("CSR.to_scipy needs SciPy: pip install scipy") from None
        return sp.csr_array((self.values, self.indices, self.indptr), shape=self.shape)

    def astype(self, dtype: Any) -> CSR:
        return CSR(self.indptr, self.indices, self.values.astype(DType.parse(dtype).np), self.shape)

    def scale(self, alpha: complex) -> CSR:
        """``alpha * A`` (in a graph: ``mul`` on the values operand)."""
        return CSR(self.indptr, self.indices, (self.values * alpha).astype(self.values.dtype), self.shape)

    def inputs(self, g: GraphBuilder, name: str) -> SparseOperand:
        """Three graph inputs ``{name}_indptr``, ``{name}_indices``, ``{name}_values`` of this
        matrix's sizes (feed them with :meth:`feed`)."""
        return SparseOperand(g.input(f"{name}_indptr", self.index_dtype, self.indptr.shape),
                             g.input(f"{name}_indices", self.index_dtype, self.indices.shape),
                             g.input(f"{name}_values", self.dtype, self.values.shape), self.shape)

    def constants(self, g: GraphBuilder, name: str) -> SparseOperand:
        """The matrix as three parameters of the graph (baked in)."""
        return SparseOperand(g.param(f"{name}_indptr", self.indptr), g.param(f"{name}_indices", self.indices),
                             g.param(f"{name}_values", self.values), self.shape)

    def feed(self, name: str) -> dict[str, np.ndarray]:
        return {f"{name}_indptr": self.indptr, f"{name}_indices": self.indices, f"{name}_values": self.values}


# -- graph helpers: one call per op ------------------------------------------------------------

def spmv(g: GraphBuilder, a: SparseOperand, x: Tensor) -> Tensor:
    out: Tensor = g.op("spmv", a.indptr, a.indices, a.values, x, shape=a.shape)
    return out


def spmm(g: GraphBuilder, a: SparseOperand, x: Tensor) -> Tensor:
    out: Tensor = g.op("spmm", a.indptr, a.indices, a.values, x, shape=a.shape)
    return out


def to_dense(g: GraphBuilder, a: SparseOperand) -> Tensor:
    out: Tensor = g.op("csr_to_dense", a.indptr, a.indices, a.values, shape=a.shape)
    return out


def add(g: GraphBuilder, a: SparseOperand, b: SparseOperand) -> SparseOperand:
    if a.shape != b.shape:
        raise ShapeError(f"sparse add of {a.shape} and {b.shape}", fix="both matrices need one shape")
    ip, ix, v = g.op("csr_add", a.indptr, a.indices, a.values, b.indptr, b.indices, b.values, shape=a.shape)
    return SparseOperand(ip, ix, v, a.shape)


def scale(g: GraphBuilder, a: SparseOperand, alpha: Tensor | float) -> SparseOperand:
    s = alpha if isinstance(alpha, Tensor) else g.const(alpha, a.values.dtype)
    return SparseOperand(a.indptr, a.indices, g.op("mul", a.values, s), a.shape)


def cg(g: GraphBuilder, a: SparseOperand, b: Tensor, **attrs: Any) -> Tensor:
    """Conjugate gradient (attributes ``max_iter``, ``tol``, ``precond``; see the ``cg`` op)."""
    out: Tensor = g.op("cg", a.indptr, a.indices, a.values, b, shape=a.shape, **attrs)
    return out


def bicgstab(g: GraphBuilder, a: SparseOperand, b: Tensor, **attrs: Any) -> Tensor:
    out: Tensor = g.op("bicgstab", a.indptr, a.indices, a.values, b, shape=a.shape, **attrs)
    return out


def solve(g: GraphBuilder, a: SparseOperand, b: Tensor) -> Tensor:
    """Direct sparse LU solve (the ``sparse_solve`` op)."""
    out: Tensor = g.op("sparse_solve", a.indptr, a.indices, a.values, b, shape=a.shape)
    return out


# -- Matrix Market -----------------------------------------------------------------------------

def _mm_error(where: str, what: str) -> SerializationError:
    return SerializationError(f"Matrix Market {where}: {what}",
                              fix="see https://math.nist.gov/MatrixMarket/formats.html")


def _read_mm(f: IO[str], where: str, dtype: Any, index_dtype: Any) -> CSR:
    header = f.readline()
    parts = header.strip().lower().split()
    if len(parts) != 5 or parts[0] != "%%matrixmarket" or parts[1] != "matrix":
        raise _mm_error(where, f"the first line is not a '%%MatrixMarket matrix ...' header: {header[:80]!r}")
    layout, field, symmetry = parts[2], parts[3], parts[4]
    if layout not in ("coordinate", "array") or field not in _MM_FIELDS or symmetry not in _MM_SYMMETRY:
        raise _mm_error(where, f"unsupported kind {layout} {field} {symmetry}")
    if field == "pattern" and layout == "array":
        raise _mm_error(where, "a pattern matrix must be in coordinate layout")
    line = f.readline()
    while line and (line.startswith("%") or not line.strip()):
        line = f.readline()
    try:
        size = [int(t) for t in line.split()]
    except ValueError:
        raise _mm_error(where, f"bad size line {line[:80]!r}") from None
    want = 3 if layout == "coordinate" else 2
    if len(size) != want or min(size) < 0:
        raise _mm_error(where, f"the size line needs {want} non-negative integers, got {line[:80]!r}")
    n, m = size[0], size[1]
    ncols = {"pattern": 0, "complex": 2}.get(field, 1)
    body = np.loadtxt(io.StringIO(f.read()), dtype=np.float64, comments="%", ndmin=2)
    if layout == "array":
        count = n * m if symmetry == "general" else (n * (n + 1) // 2 if symmetry != "skew-symmetric"
                                                     else n * (n - 1) // 2)
        flat = body.reshape(-1, max(ncols, 1)) if body.size else np.zeros((0, max(ncols, 1)))
        if flat.shape[0] != count or (symmetry != "general" and n != m):
            raise _mm_error(where, f"{flat.shape[0]} values for a {n}x{m} {symmetry} array")
        vals = flat[:, 0] + 1j * flat[:, 1] if ncols == 2 else flat[:, 0]
        if symmetry == "general":
            dense = vals.reshape(m, n).T  # column-major
        else:
            dense = np.zeros((n, n), vals.dtype)
            cols, rows = np.triu_indices(n, 0 if symmetry != "skew-symmetric" else 1)
            dense[rows, cols] = vals  # lower triangle, column by column
            sign = -1 if symmetry == "skew-symmetric" else 1
            off = rows != cols
            other = np.conj(vals[off]) if symmetry == "hermitian" else vals[off]
            dense[cols[off], rows[off]] = sign * other
        return CSR.from_dense(dense, dtype=dtype if dtype is not None else (np.complex64 if ncols == 2
                                                                           else np.float64),
                              index_dtype=index_dtype or np.int32)
    nnz = size[2]
    if body.size == 0:
        body = np.zeros((0, 2 + ncols))
    if body.shape != (nnz, 2 + ncols):
        raise _mm_error(where, f"expected {nnz} entries of {2 + ncols} numbers, got an array of {body.shape}")
    r = body[:, 0].astype(np.int64) - 1
    c = body[:, 1].astype(np.int64) - 1
    if nnz and (r.min() < 0 or r.max() >= n or c.min() < 0 or c.max() >= m
                or not np.array_equal(body[:, :2], np.floor(body[:, :2]))):
        raise _mm_error(where, f"an entry index is outside the {n}x{m} matrix (indices count from 1)")
    v: np.ndarray = (np.ones(nnz) if ncols == 0 else body[:, 2] + 1j * body[:, 3] if ncols == 2
                     else body[:, 2])
    if symmetry != "general":
        off = r != c
        if symmetry == "skew-symmetric":
            mirrored = -v[off]
        elif symmetry == "hermitian":
            mirrored = np.conj(v[off])
        else:
            mirrored = v[off]
        r, c, v = np.concatenate([r, c[off]]), np.concatenate([c, r[off]]), np.concatenate([v, mirrored])
    order = np.lexsort((c, r))
    r, c, v = r[order], c[order], v[order]
    big = max(n, m, r.size) >= 2**31 - 1
    idx = index_dtype or (np.int64 if big else np.int32)
    ip = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=ip[1:])
    out_dt = dtype if dtype is not None else (np.complex64 if ncols == 2 else np.float64)
    return CSR(ip.astype(idx), c.astype(idx), v.astype(out_dt), (n, m))


def load(source: Any, **kw: Any) -> CSR:
    """A :class:`CSR` from a SciPy sparse array, a Matrix Market path or stream, or a dense array."""
    if hasattr(source, "tocsr"):
        return CSR.from_scipy(source, **kw)
    if isinstance(source, (str, os.PathLike)) or hasattr(source, "readline"):
        return CSR.read_matrix_market(source, **kw)
    return CSR.from_dense(source, **kw)


def feed(**matrices: CSR) -> Mapping[str, np.ndarray]:
    """The inputs of several named matrices at once: ``feed(A=a, B=b)``."""
    out: dict[str, np.ndarray] = {}
    for name, a in matrices.items():
        out.update(a.feed(name))
    return out


__all__ = ["CSR", "VALUE_DTYPES", "SparseOperand", "add", "bicgstab", "cg", "feed", "load", "scale", "solve",
           "spmm", "spmv", "to_dense"]
