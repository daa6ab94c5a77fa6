"""CUDA kernels for the linear algebra ops (``rlx_core.plugin.linalg``).

* CSR products, ``csr_to_dense`` and ``csr_add`` are NVRTC kernels (:func:`sparse_source`): a
  group of ``VW`` lanes per row (``VW`` the power of two nearest the mean row length, at most 32),
  double accumulators, and no host synchronisation, so they run inside CUDA graphs. A broken CSR
  operand can never make them read or write outside their buffers: an entry whose offsets or
  column fall outside the matrix is skipped (the AUTHORING rule for device-computed indices).
* ``cg`` runs three kernels an iteration (``q = A p`` with per-block partial ``p.q``; the x/r
  update, which reduces the partials itself, with partial ``r.r``/``r.z``; the new direction) and
  one 12 KiB copy of the partials to the host, which decides convergence exactly as the float64
  reference does (``|r| <= tol |b|``). Partial sums add up in a fixed order: deterministic.
* ``bicgstab`` is the reference loop (:func:`rlx_core.plugin.linalg.bicgstab_reference`) on CuPy
  arrays (NumPy dispatches to CuPy) with the SpMV kernel; ``sparse_solve`` is cuSOLVER's sparse QR
  (``cupyx.scipy.sparse.linalg.spsolve``); the dense ops are cuSOLVER through ``cupy.linalg`` and
  ``cupyx.scipy.linalg.lu``, with the references' sign conventions.

The solvers and dense factorizations synchronise with the host (convergence tests, cuSOLVER's
status), so their kernels carry ``host_sync = True`` and a program holding one is not captured
into a CUDA graph. CuPy is imported when a kernel is bound, never at plugin import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import DType, KernelClaim, linalg

Run = Callable[[], None]
BLOCK = 256
VT = {DType.F32: "float", DType.F64: "double", DType.C64: "float2"}
IT = {DType.I32: "int", DType.I64: "long long"}
_VT_NP = {np.dtype(np.float32): DType.F32, np.dtype(np.float64): DType.F64, np.dtype(np.complex64): DType.C64}
_IT_NP = {np.dtype(np.int32): DType.I32, np.dtype(np.int64): DType.I64}


class HostSync:
    """A bound run that synchronises with the host (not capturable into a CUDA graph)."""

    host_sync = True

    def __init__(self, fn: Run) -> None:
        self.fn = fn

    def __call__(self) -> None:
        self.fn()


def _cp() -> Any:
    import cupy as cp

    return cp


# -- NVRTC sources (pure: testable without a GPU) ----------------------------------------------

_HEAD = """
#define RLX_FULL 0xffffffffu
__device__ __forceinline__ double rlx_warp_sum(double v, int width) {
    for (int o = width / 2; o > 0; o >>= 1) v += __shfl_down_sync(RLX_FULL, v, o, width);
    return v;
}
"""


def _tag(vt: DType, it: DType) -> str:
    return f"{vt.value}_{it.value}"


def spmv_source(vt: DType, it: DType, vw: int, dot: bool) -> tuple[str, str]:
    """``y = A x`` with ``vw`` lanes per row; ``dot``: also ``part[block] = sum x[row] * y[row]``
    over the block's rows (CG's curvature; square real matrices)."""
    if vw not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"vw={vw}")
    cplx = vt is DType.C64
    name = f"rlx_spmv_{_tag(vt, it)}_v{vw}{'_dot' if dot else ''}"
    v, i = VT[vt], IT[it]
    if cplx:
        acc_init = "double ar = 0.0, ai = 0.0;"
        acc_add = ("float2 a = vals[k]; float2 b = x[c]; ar += (double)a.x * b.x - (double)a.y * b.y; "
                   "ai += (double)a.x * b.y + (double)a.y * b.x;")
        acc_red = "ar = rlx_warp_sum(ar, VW); ai = rlx_warp_sum(ai, VW);"
        store = "y[row] = make_float2((float)ar, (float)ai);"
        dot_add = ""
    else:
        acc_init = "double acc = 0.0;"
        acc_add = "acc += (double)vals[k] * (double)x[c];"
        acc_red = "acc = rlx_warp_sum(acc, VW);"
        store = f"y[row] = ({v})acc;"
        dot_add = f"dot += (double)x[row] * (double)(({v})acc);" if dot else ""
    dot_tail = """
    dot = rlx_warp_sum(dot, 32);
    __shared__ double red[32];
    int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[w] = dot;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int k = 0; k < (int)(blockDim.x >> 5); ++k) s += red[k];
        part[blockIdx.x] = s;
    }""" if dot else ""
    src = _HEAD + f"""
extern "C" __global__ void {name}(const {i}* __restrict__ indptr, const {i}* __restrict__ indices,
        const {v}* __restrict__ vals, const {v}* __restrict__ x, {v}* __restrict__ y,
        long long n, long long m, long long nnz, double* __restrict__ part) {{
    const int VW = {vw};
    const int PER_WARP = 32 / VW;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    {"double dot = 0.0;" if dot else ""}
    // Warp-uniform trip count: every lane reaches every shuffle.
    for (long long r0 = warp * PER_WARP; r0 < n; r0 += warps * PER_WARP) {{
        long long row = r0 + lane / VW;
        int sub = lane % VW;
        {acc_init}
        if (row < n) {{
            long long k0 = (long long)indptr[row], k1 = (long long)indptr[row + 1];
            if (k0 >= 0 && k1 <= nnz && k0 <= k1) {{
                for (long long k = k0 + sub; k < k1; k += VW) {{
                    long long c = (long long)indices[k];
                    if (c >= 0 && c < m) {{ {acc_add} }}
                }}
            }}
        }}
        {acc_red}
        if (row < n && sub == 0) {{ {store} {dot_add} }}
    }}{dot_tail}
}}
"""
    return name, src


def spmm_source(vt: DType, it: DType) -> tuple[str, str]:
    """``Y = A X`` (X row-major (m, k)): one thread per output element, grid-stride."""
    name = f"rlx_spmm_{_tag(vt, it)}"
    v, i = VT[vt], IT[it]
    if vt is DType.C64:
        body = ("float2 a = vals[q]; float2 b = x[c * kk + j]; ar += (double)a.x * b.x - (double)a.y * b.y; "
                "ai += (double)a.x * b.y + (double)a.y * b.x;")
        init, store = "double ar = 0.0, ai = 0.0;", "y[t] = make_float2((float)ar, (float)ai);"
    else:
        body = "acc += (double)vals[q] * (double)x[c * kk + j];"
        init, store = "double acc = 0.0;", f"y[t] = ({v})acc;"
    src = f"""
extern "C" __global__ void {name}(const {i}* __restrict__ indptr, const {i}* __restrict__ indices,
        const {v}* __restrict__ vals, const {v}* __restrict__ x, {v}* __restrict__ y,
        long long n, long long m, long long nnz, long long kk) {{
    long long total = n * kk;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {{
        long long row = t / kk, j = t % kk;
        {init}
        long long k0 = (long long)indptr[row], k1 = (long long)indptr[row + 1];
        if (k0 >= 0 && k1 <= nnz && k0 <= k1) {{
            for (long long q = k0; q < k1; ++q) {{
                long long c = (long long)indices[q];
                if (c >= 0 && c < m) {{ {body} }}
            }}
        }}
        {store}
    }}
}}
"""
    return name, src


def to_dense_source(vt: DType, it: DType) -> tuple[str, str]:
    """One thread per row adds its entries into the zeroed dense row (duplicates in order)."""
    name = f"rlx_csr_to_dense_{_tag(vt, it)}"
    v, i = VT[vt], IT[it]
    add = ("o[row * m + c].x += vals[k].x; o[row * m + c].y += vals[k].y;" if vt is DType.C64
           else "o[row * m + c] += vals[k];")
    src = f"""
extern "C" __global__ void {name}(const {i}* __restrict__ indptr, const {i}* __restrict__ indices,
        const {v}* __restrict__ vals, {v}* __restrict__ o, long long n, long long m, long long nnz) {{
    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n;
         row += (long long)gridDim.x * blockDim.x) {{
        long long k0 = (long long)indptr[row], k1 = (long long)indptr[row + 1];
        if (k0 < 0 || k1 > nnz || k0 > k1) continue;
        for (long long k = k0; k < k1; ++k) {{
            long long c = (long long)indices[k];
            if (c >= 0 && c < m) {{ {add} }}
        }}
    }}
}}
"""
    return name, src


def csr_add_source(vt: DType, it: DType) -> tuple[str, str]:
    """Row r of the sum: a's entries at ``bip[r] + k``, then b's at ``aip[r + 1] + k``."""
    name = f"rlx_csr_add_{_tag(vt, it)}"
    v, i = VT[vt], IT[it]
    src = f"""
extern "C" __global__ void {name}(const {i}* __restrict__ aip, const {i}* __restrict__ aix,
        const {v}* __restrict__ av, const {i}* __restrict__ bip, const {i}* __restrict__ bix,
        const {v}* __restrict__ bv, {i}* __restrict__ oip, {i}* __restrict__ oix, {v}* __restrict__ ov,
        long long n, long long na, long long nb) {{
    long long total = na + nb;
    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row <= n;
         row += (long long)gridDim.x * blockDim.x) {{
        oip[row] = aip[row] + bip[row];
        if (row == n) continue;
        long long a0 = (long long)aip[row], a1 = (long long)aip[row + 1];
        long long b0 = (long long)bip[row], b1 = (long long)bip[row + 1];
        if (a0 < 0 || a1 > na || a0 > a1 || b0 < 0 || b1 > nb || b0 > b1) continue;
        for (long long k = a0; k < a1; ++k) {{
            long long p = b0 + k;
            if (p >= 0 && p < total) {{ oix[p] = aix[k]; ov[p] = av[k]; }}
        }}
        for (long long k = b0; k < b1; ++k) {{
            long long p = a1 + k;
            if (p >= 0 && p < total) {{ oix[p] = bix[k]; ov[p] = bv[k]; }}
        }}
    }}
}}
"""
    return name, src


def cg_sources(vt: DType, it: DType) -> dict[str, tuple[str, str]]:
    """The CG kernels besides the SpMV: Jacobi diagonal, update, direction."""
    v, i, tag = VT[vt], IT[it], _tag(vt, it)
    block_sum = """
__device__ double rlx_block_sum(double v) {
    __shared__ double red[32];
    v = rlx_warp_sum(v, 32);
    int w = threadIdx.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0) for (int k = 0; k < (int)(blockDim.x >> 5); ++k) s += red[k];
    return s;  // valid in thread 0
}
"""
    diag = f"""
extern "C" __global__ void rlx_cg_diag_{tag}(const {i}* __restrict__ indptr, const {i}* __restrict__ indices,
        const {v}* __restrict__ vals, {v}* __restrict__ dinv, long long n, long long nnz, int invert) {{
    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n;
         row += (long long)gridDim.x * blockDim.x) {{
        double d = 0.0;
        long long k0 = (long long)indptr[row], k1 = (long long)indptr[row + 1];
        if (k0 >= 0 && k1 <= nnz && k0 <= k1)
            for (long long k = k0; k < k1; ++k) if ((long long)indices[k] == row) d += (double)vals[k];
        dinv[row] = ({v})(invert ? (d != 0.0 ? 1.0 / d : 1.0) : d);
    }}
}}
"""
    update = _HEAD + block_sum + f"""
extern "C" __global__ void rlx_cg_update_{tag}({v}* __restrict__ x, {v}* __restrict__ r,
        const {v}* __restrict__ p, const {v}* __restrict__ q, {v}* __restrict__ z,
        const {v}* __restrict__ dinv, double* __restrict__ part, long long n, long long g, double rz,
        int jacobi) {{
    // part rows: [0, g) p.q partials (in), [g, 2g) r.r and [2g, 3g) r.z partials (out).
    __shared__ double alpha_s;
    double s = 0.0;
    for (long long k = threadIdx.x; k < g; k += blockDim.x) s += part[k];
    s = rlx_block_sum(s);
    if (threadIdx.x == 0) alpha_s = s != 0.0 ? rz / s : 0.0;  // p.q == 0: no step (the host stops)
    __syncthreads();
    double alpha = alpha_s;
    double rr = 0.0, rzs = 0.0;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (long long)gridDim.x * blockDim.x) {{
        x[t] = ({v})((double)x[t] + alpha * (double)p[t]);
        double ri = (double)r[t] - alpha * (double)q[t];
        r[t] = ({v})ri;
        ri = (double)r[t];
        rr += ri * ri;
        if (jacobi) {{ {v} zi = ({v})((double)dinv[t] * ri); z[t] = zi; rzs += ri * (double)zi; }}
    }}
    rr = rlx_block_sum(rr);
    __syncthreads();
    rzs = rlx_block_sum(rzs);
    if (threadIdx.x == 0) {{ part[g + blockIdx.x] = rr; part[2 * g + blockIdx.x] = jacobi ? rzs : rr; }}
}}
"""
    direction = f"""
extern "C" __global__ void rlx_cg_direction_{tag}({v}* __restrict__ p, const {v}* __restrict__ z,
        long long n, double beta) {{
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (long long)gridDim.x * blockDim.x)
        p[t] = ({v})((double)z[t] + beta * (double)p[t]);
}}
"""
    return {"diag": (f"rlx_cg_diag_{tag}", diag), "update": (f"rlx_cg_update_{tag}", update),
            "direction": (f"rlx_cg_direction_{tag}", direction)}


def vector_width(n: int, nnz: int) -> int:
    """Lanes per row: the power of two at or above the mean row length, 1 to 32."""
    mean = nnz / max(n, 1)
    vw = 1
    while vw < 32 and vw < mean:
        vw *= 2
    return vw


# -- factories ---------------------------------------------------------------------------------

def _shape(b: Any) -> tuple[int, int]:
    s = b.attrs["shape"]
    return int(s[0]), int(s[1])


def _grid(work: int, b: Any, per_block: int = BLOCK) -> int:
    return max(1, min(-(-work // per_block), int(b.ctx.sm_count) * 8))


def _kernel(src: tuple[str, str]) -> Any:
    from .kernels import raw_kernel

    return raw_kernel(*src)


def _types(ins: Sequence[Any]) -> tuple[DType, DType]:
    return _VT_NP[np.dtype(ins[2].dtype)], _IT_NP[np.dtype(ins[0].dtype)]


def _noop() -> None:
    return None


def k_spmv(b: Any) -> Run:
    cp = _cp()
    ip, ix, v, x = b.ins
    y = b.outs[0]
    n, m = _shape(b)
    if n == 0:
        return _noop
    vt, it = _types(b.ins)
    nnz = int(ix.shape[0])
    vw = vector_width(n, nnz)
    k = _kernel(spmv_source(vt, it, vw, False))
    grid = _grid(n * vw, b)
    args = (ip, ix, v, x, y, np.int64(n), np.int64(m), np.int64(nnz), cp.zeros(1, cp.float64))
    return lambda: k((grid,), (BLOCK,), args)


def k_spmm(b: Any) -> Run:
    cp = _cp()
    ip, ix, v, x = b.ins
    y = b.outs[0]
    n, m = _shape(b)
    kk = int(x.shape[1])
    if n * kk == 0:
        return _noop
    vt, it = _types(b.ins)
    k = _kernel(spmm_source(vt, it))
    grid = _grid(n * kk, b)
    xc = x if x.flags.c_contiguous else None

    def run() -> None:
        xx = xc if xc is not None else cp.ascontiguousarray(x)
        k((grid,), (BLOCK,), (ip, ix, v, xx, y, np.int64(n), np.int64(m), np.int64(ix.shape[0]),
                              np.int64(kk)))
    return run


def k_csr_to_dense(b: Any) -> Run:
    ip, ix, v = b.ins
    o = b.outs[0]
    n, m = _shape(b)
    if n * m == 0:
        return _noop
    vt, it = _types(b.ins)
    k = _kernel(to_dense_source(vt, it))
    grid = _grid(n, b)

    def run() -> None:
        o.fill(0)
        k((grid,), (BLOCK,), (ip, ix, v, o, np.int64(n), np.int64(m), np.int64(ix.shape[0])))
    return run


def k_csr_add(b: Any) -> Run:
    aip, aix, av, bip, bix, bv = b.ins
    oip, oix, ov = b.outs
    n, _ = _shape(b)
    vt, it = _types(b.ins)
    k = _kernel(csr_add_source(vt, it))
    grid = _grid(n + 1, b)
    args = (aip, aix, av, bip, bix, bv, oip, oix, ov, np.int64(n), np.int64(aix.shape[0]),
            np.int64(bix.shape[0]))
    return lambda: k((grid,), (BLOCK,), args)


def k_cg(b: Any) -> Run:
    cp = _cp()
    ip, ix, v, rhs = b.ins
    x = b.outs[0]
    n, m = _shape(b)
    max_iter, tol = int(b.attrs["max_iter"]), float(b.attrs["tol"])
    jacobi = b.attrs["precond"] == "jacobi"
    vt, it = _types(b.ins)
    nnz = int(ix.shape[0])
    dt = x.dtype
    vw = vector_width(n, nnz)
    g = _grid(max(n, 1), b)
    spmv = _kernel(spmv_source(vt, it, vw, True))
    ks = {key: _kernel(src) for key, src in cg_sources(vt, it).items()}
    r, p, q = (cp.zeros(max(n, 1), dt) for _ in range(3))
    z = cp.zeros(max(n, 1), dt)
    dinv = cp.zeros(max(n, 1), dt)
    part = cp.zeros(3 * g, cp.float64)
    host = np.zeros(3 * g)
    n64, m64, nnz64, g64 = np.int64(n), np.int64(m), np.int64(nnz), np.int64(g)
    grid_mv = g  # the SpMV's partial p.q per block must cover exactly the update kernel's g blocks

    def solve() -> None:
        x.fill(0)
        if n == 0:
            return
        cp.copyto(r[:n], rhs)
        bnorm = float(cp.linalg.norm(rhs.astype(cp.float64)))
        bound = tol * bnorm
        if bnorm <= bound:
            return
        if jacobi:
            ks["diag"]((g,), (BLOCK,), (ip, ix, v, dinv, n64, nnz64, np.int32(1)))
            cp.multiply(dinv[:n], r[:n], out=z[:n])
            cp.copyto(p[:n], z[:n])
            rz = float(cp.dot(r[:n].astype(cp.float64), z[:n].astype(cp.float64)))
        else:
            cp.copyto(p[:n], r[:n])
            rz = float(cp.dot(r[:n].astype(cp.float64), r[:n].astype(cp.float64)))
        zz = z if jacobi else r
        for _ in range(max_iter):
            spmv((grid_mv,), (BLOCK,), (ip, ix, v, p, q, n64, m64, nnz64, part))
            ks["update"]((g,), (BLOCK,), (x, r, p, q, z, dinv, part, n64, g64, np.float64(rz),
                                          np.int32(jacobi)))
            part.get(out=host)  # synchronises: the host decides, as the reference does
            if float(host[:g].sum()) == 0:
                break
            if float(np.sqrt(host[g:2 * g].sum())) <= bound:
                break
            rz_new = float(host[2 * g:].sum())
            if rz_new == 0:
                break
            ks["direction"]((g,), (BLOCK,), (p, zz, n64, np.float64(rz_new / rz)))
            rz = rz_new
    return HostSync(solve)


class _CsrOperator:
    """``A @ x`` and ``A.diagonal()`` on the device, for the shared BiCGSTAB loop."""

    def __init__(self, b: Any) -> None:
        cp = _cp()
        self.ip, self.ix, self.v = b.ins[:3]
        self.n, self.m = _shape(b)
        vt, it = _types(b.ins)
        nnz = int(self.ix.shape[0])
        self.vw = vector_width(self.n, nnz)
        self.k = _kernel(spmv_source(vt, it, self.vw, False))
        self.kd = _kernel(cg_sources(vt, it)["diag"])
        self.grid = _grid(self.n * self.vw, b)
        self.dummy = cp.zeros(1, cp.float64)
        self.nnz = np.int64(nnz)

    def __matmul__(self, x: Any) -> Any:
        cp = _cp()
        y = cp.empty(self.n, self.v.dtype)
        self.k((self.grid,), (BLOCK,), (self.ip, self.ix, self.v, cp.ascontiguousarray(x), y,
                                        np.int64(self.n), np.int64(self.m), self.nnz, self.dummy))
        return y

    def diagonal(self) -> Any:
        cp = _cp()
        d = cp.empty(self.n, self.v.dtype)
        self.kd((self.grid,), (BLOCK,), (self.ip, self.ix, self.v, d, np.int64(self.n), self.nnz,
                                         np.int32(0)))
        return d


def k_bicgstab(b: Any) -> Run:
    cp = _cp()
    n, _ = _shape(b)
    max_iter, tol = int(b.attrs["max_iter"]), float(b.attrs["tol"])
    jacobi = b.attrs["precond"] == "jacobi"
    op = _CsrOperator(b) if n else None
    rhs, x = b.ins[3], b.outs[0]

    def run() -> None:
        if op is None:
            return
        cp.copyto(x, linalg.bicgstab_reference(op, rhs.copy(), max_iter, tol, jacobi, xp=cp))
    return HostSync(run)


def k_sparse_solve(b: Any) -> Run:
    cp = _cp()
    import cupyx.scipy.sparse as csp
    from cupyx.scipy.sparse.linalg import spsolve

    ip, ix, v, rhs = b.ins
    x = b.outs[0]
    n, m = _shape(b)

    def run() -> None:
        if n == 0:
            return
        a = csp.csr_matrix((v.copy(), ix.astype(cp.int32), ip.astype(cp.int32)), shape=(n, m))
        a.sum_duplicates()
        if rhs.ndim == 1:
            cp.copyto(x, spsolve(a, rhs))
        else:
            for j in range(rhs.shape[1]):
                cp.copyto(x[:, j], spsolve(a, cp.ascontiguousarray(rhs[:, j])))
    return HostSync(run)


# -- dense -------------------------------------------------------------------------------------

def sign_fix(v: Any) -> Any:
    """:func:`rlx_core.plugin.linalg.sign_fix` on the device."""
    cp = _cp()
    i = cp.argmax(cp.abs(v), axis=-2)
    pick = cp.take_along_axis(v, i[..., None, :], axis=-2)[..., 0, :]
    return cp.where(pick < 0, -1.0, 1.0).astype(v.dtype)


def _each(fn: Callable[[Any], Sequence[Any]], a: Any) -> list[Any]:
    """``fn`` per matrix of a batch (..., m, n), results stacked."""
    cp = _cp()
    if a.ndim == 2:
        return list(fn(a))
    flat = a.reshape((-1, *a.shape[-2:]))
    res = [fn(mat) for mat in flat]
    return [cp.stack([r[i] for r in res]).reshape((*a.shape[:-2], *res[0][i].shape))
            for i in range(len(res[0]))]


def _qr(a: Any) -> tuple[Any, Any]:
    cp = _cp()
    q, r = cp.linalg.qr(a, mode="reduced")
    s = cp.where(cp.diagonal(r) < 0, -1.0, 1.0).astype(a.dtype)
    return q * s[None, :], r * s[:, None]


def _eigh(a: Any) -> tuple[Any, Any]:
    cp = _cp()
    w, v = cp.linalg.eigh(a, UPLO="L")
    return w, v * sign_fix(v)[..., None, :]


def _svd(a: Any) -> tuple[Any, Any, Any]:
    cp = _cp()
    u, s, vh = cp.linalg.svd(a, full_matrices=False)
    f = sign_fix(u)
    return u * f[None, :], s, vh * f[:, None]


def _lu(a: Any) -> tuple[Any, Any, Any]:
    from cupyx.scipy.linalg import lu

    p, lo, u = lu(a)
    return p, lo, u


def _dense(fn: Callable[[Any], Sequence[Any]], batched: bool = False) -> Callable[[Any], Run]:
    def factory(b: Any) -> Run:
        cp = _cp()
        a = b.ins[0]

        def run() -> None:
            if a.size == 0:
                for o in b.outs:
                    o.fill(0)
                return
            res = fn(a) if batched else _each(fn, a)
            for o, r in zip(b.outs, res):
                cp.copyto(o, r.astype(o.dtype, copy=False))
        return HostSync(run)
    return factory


def k_solve(b: Any) -> Run:
    cp = _cp()
    a, rhs = b.ins
    x = b.outs[0]

    def run() -> None:
        if a.shape[-1] == 0 or rhs.size == 0:
            x.fill(0)
            return
        cp.copyto(x, cp.linalg.solve(a, rhs))
    return HostSync(run)


def k_lstsq(b: Any) -> Run:
    cp = _cp()
    a, rhs = b.ins
    x = b.outs[0]

    def run() -> None:
        if a.size == 0:
            x.fill(0)
            return
        cp.copyto(x, cp.linalg.lstsq(a, rhs, rcond=None)[0])
    return HostSync(run)


FACTORIES: dict[str, Callable[[Any], Run]] = {
    "cuda.spmv": k_spmv, "cuda.spmm": k_spmm, "cuda.csr_to_dense": k_csr_to_dense,
    "cuda.csr_add": k_csr_add, "cuda.cg": k_cg, "cuda.bicgstab": k_bicgstab,
    "cuda.sparse_solve": k_sparse_solve, "cuda.solve": k_solve,
    "cuda.cholesky": _dense(lambda a: (_cp().linalg.cholesky(a),), batched=True),
    "cuda.lu": _dense(_lu), "cuda.qr": _dense(_qr), "cuda.eigh": _dense(_eigh, batched=True),
    "cuda.svd": _dense(_svd), "cuda.lstsq": k_lstsq,
}


def claims() -> list[KernelClaim]:
    idx = frozenset({DType.I32, DType.I64})
    f = frozenset({DType.F32, DType.F64})
    fc = f | {DType.C64}
    out = [KernelClaim(op, f"cuda.{op}", dtypes=idx | fc, out_dtypes=idx | fc)
           for op in ("spmv", "spmm", "csr_to_dense", "csr_add")]
    out += [KernelClaim(op, f"cuda.{op}", dtypes=idx | f, out_dtypes=f)
            for op in ("cg", "bicgstab", "sparse_solve")]
    out += [KernelClaim(op, f"cuda.{op}", dtypes=f) for op in ("solve", "cholesky", "lu", "qr", "eigh", "svd",
                                                               "lstsq")]
    return out


__all__ = ["FACTORIES", "HostSync", "claims", "cg_sources", "csr_add_source", "spmm_source", "spmv_source",
           "to_dense_source", "vector_width"]
