"""Numba kernels for CSR matrices and conjugate gradient (compiled on first use, cached).

Every kernel works on a block range ``lo:hi`` of rows (``block`` rows a block) so that
:mod:`rlx_cpu.parallel` can split it over the cores, and writes per-block partial dot products:
their sum in block order is the same whatever the thread count, so results are deterministic.
A row whose offsets leave ``[0, nnz]`` or run backwards, or a column outside ``[0, m)``, is never
read: the kernel sets ``bad[0]`` and the caller raises ``InputError``.

Indices are unsigned 64-bit once checked: Numba then drops its negative-index wraparound select,
which halves the time of the SpMV loop (it matches SciPy's C++ loop on one core).
"""

from __future__ import annotations

from numba import int64, njit, uint64


@njit(inline="always", nogil=True, fastmath={"contract", "nsz"})
def _row(indptr, indices, values, x, i, nnz, m, acc):
    """Row i of A times x added to ``acc`` (its type: float or complex), and whether the row was
    malformed (offsets outside ``[0, nnz]`` or backwards: nothing read; a column outside ``[0, m)``:
    that entry skipped)."""
    k0 = int64(indptr[i])
    k1 = int64(indptr[i + uint64(1)])
    if k0 < 0 or k0 > k1 or uint64(k1) > nnz:
        return acc, True
    flag = False
    for k in range(uint64(k0), uint64(k1)):
        c = uint64(int64(indices[k]))  # a negative column wraps to a huge one: rejected
        if c < m:
            acc += values[k] * x[c]
        else:
            flag = True
    return acc, flag


@njit(cache=True, nogil=True, fastmath={"contract", "nsz"})
def spmv_blocks(indptr, indices, values, x, y, bad, block, lo, hi):
    """y = A x over blocks lo:hi; real or complex (the accumulator starts as y's zero)."""
    n = uint64(y.shape[0])
    nnz = uint64(indices.shape[0])
    m = uint64(x.shape[0])
    zero = y.dtype.type(0)
    flag = False
    for b in range(uint64(lo), uint64(hi)):
        for i in range(b * uint64(block), min(n, (b + uint64(1)) * uint64(block))):
            acc, row_bad = _row(indptr, indices, values, x, i, nnz, m, zero)
            flag |= row_bad
            y[i] = acc
    if flag:
        bad[0] = 1


@njit(cache=True, nogil=True, fastmath={"contract", "nsz"})
def spmm_blocks(indptr, indices, values, x, y, bad, block, lo, hi):
    n = uint64(y.shape[0])
    nnz = uint64(indices.shape[0])
    m = uint64(x.shape[0])
    kk = uint64(x.shape[1])
    flag = False
    for b in range(uint64(lo), uint64(hi)):
        for i in range(b * uint64(block), min(n, (b + uint64(1)) * uint64(block))):
            for j in range(kk):
                y[i, j] = 0
            k0 = int64(indptr[i])
            k1 = int64(indptr[i + uint64(1)])
            if k0 < 0 or k0 > k1 or uint64(k1) > nnz:
                flag = True
                continue
            for k in range(uint64(k0), uint64(k1)):
                c = uint64(int64(indices[k]))
                if c >= m:
                    flag = True
                    continue
                v = values[k]
                for j in range(kk):
                    y[i, j] += v * x[c, j]
    if flag:
        bad[0] = 1


@njit(cache=True, nogil=True, fastmath={"contract", "nsz"})
def spmv_dot_blocks(indptr, indices, values, p, q, part, bad, block, lo, hi):
    """q = A p and part[b] = p . q over block b (the CG curvature)."""
    n = uint64(q.shape[0])
    nnz = uint64(indices.shape[0])
    m = uint64(p.shape[0])
    flag = False
    for b in range(uint64(lo), uint64(hi)):
        s = 0.0
        for i in range(b * uint64(block), min(n, (b + uint64(1)) * uint64(block))):
            acc, row_bad = _row(indptr, indices, values, p, i, nnz, m, 0.0)
            flag |= row_bad
            q[i] = acc
            s += p[i] * q[i]
        part[b] = s
    if flag:
        bad[0] = 1


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"})
def cg_update_blocks(x, r, p, q, z, dinv, sc, jacobi, part_rr, part_rz, block, lo, hi):
    """x += alpha p; r -= alpha q (alpha = sc[0]); z = dinv r (jacobi); per block r.r and r.z."""
    n = uint64(x.shape[0])
    alpha = sc[0]
    for b in range(uint64(lo), uint64(hi)):
        rr = 0.0
        rz = 0.0
        for i in range(b * uint64(block), min(n, (b + uint64(1)) * uint64(block))):
            x[i] += alpha * p[i]
            ri = r[i] - alpha * q[i]
            r[i] = ri
            rr += ri * ri
            if jacobi:
                zi = dinv[i] * ri
                z[i] = zi
                rz += ri * zi
        part_rr[b] = rr
        part_rz[b] = rz if jacobi else rr


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz"})
def cg_direction_blocks(p, z, sc, block, lo, hi):
    """p = z + beta p (beta = sc[1])."""
    n = uint64(p.shape[0])
    beta = sc[1]
    for b in range(uint64(lo), uint64(hi)):
        for i in range(b * uint64(block), min(n, (b + uint64(1)) * uint64(block))):
            p[i] = z[i] + beta * p[i]


@njit(cache=True, nogil=True)
def diagonal(indptr, indices, values, d):
    """d[i] = sum of the stored entries at (i, i) (structure already checked)."""
    for i in range(d.shape[0]):
        s = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            if indices[k] == i:
                s += values[k]
        d[i] = s
