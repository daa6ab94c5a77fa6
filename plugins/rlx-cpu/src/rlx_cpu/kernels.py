"""Kernel factories: ``factory(ins, outs, attrs) -> run()`` binds arena views once, at compile time.

Binding views up front keeps the per-kernel cost at one Python call plus the NumPy call, and every
kernel writes into its planned output buffer (``out=``) so nothing is allocated on the hot path
where NumPy allows it. Runs need no ``np.errstate`` of their own: every program runs its kernels
with floating-point warnings off (``rlx_cpu.program``; the context manager cost ~1-3 us a call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, device_error, normalize_axis

from . import special

Run = Callable[[], None]
Factory = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], Attrs], Run]


def copy_run(o: np.ndarray, src: np.ndarray) -> Run:
    """``o[...] = src`` as a bound method: the assignment ``np.copyto`` makes (broadcasting, overlap
    handled) without its wrapper: a small transpose 0.85 -> 0.58 us a call
    (``bench/cpu_call_overhead.py``); a small model's transposes, slices and expands are mostly
    that. Other dtypes keep copyto's same-kind casting."""
    if src.dtype != o.dtype:
        return lambda: np.copyto(o, src)
    return partial(o.__setitem__, Ellipsis, src)


def ufunc1(f: Any) -> Factory:
    def make(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
        x, o = ins[0], outs[0]
        return lambda: f(x, out=o)
    return make


def ufunc2(f: Any) -> Factory:
    def make(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
        a, b = ins
        o = outs[0]
        return lambda: f(a, b, out=o)
    return make


def k_add(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    """``np.add``; a same-shape float add of at least ``ROWS_NUMBA_MIN`` elements (a residual
    connection) is a row kernel, so it can join its neighbours' row chain
    (:func:`rlx_cpu.parallel.chain`)."""
    from .hir_kernels import ROWS_NUMBA_MIN

    a, b = ins
    o = outs[0]
    if (a.shape == b.shape == o.shape and o.ndim >= 1 and o.size >= ROWS_NUMBA_MIN
            and a.dtype == b.dtype == o.dtype and o.dtype in (np.float32, np.float64)
            and all(x.flags.c_contiguous for x in (a, b, o))):
        from .parallel import split_rows

        w = o.shape[-1]
        a2, b2, o2 = a.reshape(-1, w), b.reshape(-1, w), o.reshape(-1, w)

        def rows(lo: int, hi: int) -> None:
            np.add(a2[lo:hi], b2[lo:hi], out=o2[lo:hi])
        return split_rows(rows, o2.shape[0], (), o.size, rows_in=[a2, b2], rows_out=[o2])
    return lambda: np.add(a, b, out=o)


def k_rsqrt(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]

    def run() -> None:
        np.sqrt(x, out=o)
        np.divide(1, o, out=o)
    return run


def k_reciprocal(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    one = np.ones((), o.dtype)
    return lambda: np.divide(one, x, out=o)


def k_abs(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    return lambda: np.abs(x, out=o)


def k_int_div(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, b = ins
    o = outs[0]
    if o.dtype.kind == "u":
        def run_unsigned() -> None:
            # Truncation is floor for unsigned operands; u64 would not survive the int64 path below.
            q = a // np.where(b == 0, b.dtype.type(1), b)
            np.copyto(o, np.where(b == 0, 0, q), casting="unsafe")
        return run_unsigned

    def run() -> None:
        # C semantics (truncate toward zero), exact for every pair: a - fmod(a, b) is a multiple of b.
        # (|a| // |b| overflowed for INT64_MIN.) A zero divisor gives 0, like the reference.
        a64, b64 = a.astype(np.int64), b.astype(np.int64)
        q = (a64 - np.fmod(a64, b64)) // np.where(b64 == 0, 1, b64)
        np.copyto(o, np.where(b64 == 0, 0, q), casting="unsafe")
    return run


_WHERE_PROGRAM = '{"ops":[["where",["i0","i1","i2"],{}]],"out":"t0"}'


def k_where(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    c, a, b = ins
    o = outs[0]
    if o.dtype in (np.float32, np.float64) and o.size >= 8192:
        # One generated pass (select per element) instead of a fill plus a masked copy.
        from rlx_core.plugin import DType

        from .fused import k_fused, supported

        if supported([DType.BOOL, DType.parse(a.dtype), DType.parse(b.dtype)], DType.parse(o.dtype),
                     _WHERE_PROGRAM) is None:
            run_fused = k_fused(ins, outs, Attrs({"program": _WHERE_PROGRAM}), force_codegen=True)
            if run_fused is not None:
                return run_fused

    def run() -> None:
        np.copyto(o, b)
        np.copyto(o, a, where=c)
    return run


def k_cast(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    if o.dtype == np.bool_:
        return lambda: np.not_equal(x, 0, out=o)
    if x.dtype.kind == "c" and o.dtype.kind != "c":
        return lambda: np.copyto(o, x.real, casting="unsafe")
    if o.dtype.kind in "iu" and (x.dtype.kind == "f" or x.dtype.name == "bfloat16"):
        def run() -> None:
            np.copyto(o, np.trunc(x.astype(np.float64)), casting="unsafe")
        return run

    def plain() -> None:
        np.copyto(o, x, casting="unsafe")
    return plain


def _axes(attrs: Attrs, rank: int) -> tuple[int, ...]:
    axes = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted({normalize_axis(a, rank) for a in axes}))  # type: ignore[union-attr]


def reduction(f: Any, with_dtype: bool = True) -> Factory:
    def make(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
        x, o = ins[0], outs[0]
        axes = _axes(attrs, x.ndim)
        keep = bool(attrs["keepdims"])
        # Reduce into a view with the reduced axes kept, so `out=` always has the right rank.
        okeep = o.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
        kw = {"dtype": o.dtype} if with_dtype else {}
        target = o if keep else okeep
        if x.size == 0 and f in (np.max, np.min):
            if o.size:  # an empty reduced axis: no identity (inference should have refused it)
                raise ValueError("empty reduction")
            # A kept axis is 0, so the output is empty too: nothing to compute.
            return lambda: None
        # The ufunc's own reduce: np.sum/np.mean/np.max wrap it in ~2-4 us of Python per call
        # (a third of a small LayerNorm's time). np.mean is this sum then this division.
        red = _REDUCE.get(f)
        if red is None:
            return lambda: f(x, axis=axes, out=target, keepdims=True, **kw)
        total = _rows_sum(f, x, axes, target)
        if total is None:
            total = partial(red, x, axis=axes, out=target, keepdims=True, **kw)
        if f is np.mean:
            n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
            count: Any = np.intp(n)  # as np.mean
            div = np.true_divide
            if o.dtype.kind == "f" and float(o.dtype.type(n)) == n:
                # The count in the output's dtype: a same-type loop, not a pass through float64
                # (with the sum: 4.20 -> 2.51 us over (1, 4, 16, 16), bench/cpu_call_overhead.py).
                # Equal to np.mean's float64 quotient rounded to it: double rounding is
                # harmless for division when the wide type has >= 2p+2 bits (53 vs 24; 24 vs 11).
                count = o.dtype.type(n)

            def mean() -> None:
                total()
                div(target, count, out=target, casting="unsafe")
            return mean
        return total
    return make


#: Elements a row up to which a sum over trailing axes of many rows is one BLAS matrix-vector
#: product with ones: NumPy's reduce pays per row where the product streams (DeepLabV3's image
#: pooling, 960 rows of 16: 20.7 -> 4.2 us with the division, bench/cpu_call_overhead.py); above
#: it NumPy's pairwise sum is the more accurate (the product adds in a few float32 partial sums).
ROWS_SUM_MAX = 256
#: Rows from which that product is taken (fewer: NumPy's loop costs less than the BLAS call).
ROWS_SUM_MIN = 64


def _rows_sum(f: Any, x: np.ndarray, axes: tuple[int, ...], target: np.ndarray) -> Any:
    """The sum of a float sum or mean over trailing axes into ``target`` as ``x (rows, inner) @
    ones``, or None where NumPy's own reduce is kept."""
    k = x.ndim - len(axes)
    if (f not in (np.sum, np.mean) or x.dtype not in (np.float32, np.float64) or target.dtype != x.dtype
            or axes != tuple(range(k, x.ndim)) or not x.flags.c_contiguous
            or not target.flags.c_contiguous or np.may_share_memory(x, target)):
        return None
    inner = int(np.prod(x.shape[k:], dtype=np.int64))
    rows = x.size // inner if inner else 0
    if not (2 <= inner <= ROWS_SUM_MAX and rows >= ROWS_SUM_MIN):
        return None
    return partial(np.dot, x.reshape(rows, inner), np.ones(inner, x.dtype), out=target.reshape(rows))


_REDUCE: dict[Any, Any] = {np.sum: np.add.reduce, np.mean: np.add.reduce, np.prod: np.multiply.reduce,
                           np.max: np.maximum.reduce, np.min: np.minimum.reduce}


def k_arg(f: Any) -> Factory:
    def make(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
        x, o = ins[0], outs[0]
        ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
        okeep = o.reshape([1 if i == ax else d for i, d in enumerate(x.shape)])
        return lambda: f(x, axis=ax, out=okeep, keepdims=True)
    return make


def k_matmul(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, b = ins
    o = outs[0]
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and o.flags.c_contiguous:
        # (..., M, K) @ (K, N) is one (prod(...)*M, K) @ (K, N) GEMM, not one GEMM per leading index.
        a = a.reshape(-1, a.shape[-1])
        o = o.reshape(-1, o.shape[-1])
    from .blas import numpy_gemm

    gemm = numpy_gemm(a, b, o)
    return lambda: gemm(a, b, out=o)


def k_reshape(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    if np.shares_memory(x, o):
        return lambda: None  # planned in place: same bytes, nothing to move
    return copy_run(o, x.reshape(o.shape))


def k_transpose(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    src = np.transpose(x, attrs["perm"])
    if 2 <= o.ndim <= 4 and o.flags.c_contiguous and o.size >= 32768 and o.dtype.kind in "fiub":
        # A row kernel (rows: the first two output axes), so the head split/merge of attention
        # joins the row chain of the projections around it instead of breaking it.
        from .parallel import split_rows

        pad = (1,) * (4 - o.ndim)
        s4, o4 = src.reshape(pad + src.shape), o.reshape(pad + o.shape)
        d1 = o4.shape[1]

        def rows(lo: int, hi: int) -> None:  # NumPy's strided copy, a slab of the first axis at a time
            for i0 in range(lo // d1, (hi + d1 - 1) // d1):
                a, b = max(lo - i0 * d1, 0), min(hi - i0 * d1, d1)
                np.copyto(o4[i0, a:b], s4[i0, a:b])
        n = o4.shape[0] * d1
        return split_rows(rows, n, (), o.size, whole_in=[x], rows_out=[o4.reshape(n, -1)])
    return copy_run(o, src)


def k_expand(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    return copy_run(outs[0], ins[0])


def k_slice(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    from rlx_core.plugin import slice_params

    x, o = ins[0], outs[0]
    idx: list[Any] = [slice(None)] * x.ndim
    for ax, sl in slice_params(attrs, x.shape):
        idx[ax] = sl
    return copy_run(o, x[tuple(idx)])


def k_concat(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    xs, o = list(ins), outs[0]
    ax = normalize_axis(attrs["axis"], o.ndim)  # type: ignore[arg-type]
    if len(xs) > 4 or any(np.may_share_memory(x, o) for x in xs):
        return lambda: np.concatenate(xs, axis=ax, out=o)
    # A few parts (a KV cache and its new step): one assignment each into its slab of the output,
    # a KV cache step 0.78 -> 0.62 us (bench/cpu_call_overhead.py; no part overlaps the output).
    parts, at = [], 0
    for x in xs:
        parts.append(copy_run(o[(slice(None),) * ax + (slice(at, at + x.shape[ax]),)], x))
        at += x.shape[ax]
    if len(parts) == 2:
        first, second = parts

        def run2() -> None:
            first()
            second()
        return run2

    def run() -> None:
        for p in parts:
            p()
    return run


def k_pad(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    r = x.ndim
    pads = attrs["pads"]
    # The trailing Ellipsis keeps a rank-0 `o[()]` a writable view instead of a NumPy scalar.
    inner = o[tuple(slice(pads[i], pads[i] + x.shape[i]) for i in range(r)) + (Ellipsis,)]  # type: ignore[index]
    with np.errstate(invalid="ignore"):
        value = np.asarray(attrs["value"]).astype(o.dtype)

    def run() -> None:
        o.fill(value)
        np.copyto(inner, x)
    return run


def k_gather(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, idx = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    n = x.shape[ax]
    if not idx.flags.writeable and idx.size == 1 and idx.dtype.kind in "iu":
        # A constant index (read-only: the program's weights; checked when the graph compiled), as
        # exporters write a select or unbind: the slab it picks is a view, the run one assignment.
        i = int(idx.reshape(-1)[0])
        if -n <= i < n:
            i %= n
            src = x[(slice(None),) * ax + (slice(i, i + 1),)].reshape(o.shape)
            if np.may_share_memory(src, x):  # a view (a reshape that copied would go stale)
                return copy_run(o, src)
    take = x.take  # the method, arguments positional: ~0.5 us a call where np.take's wrapper was ~1.2

    def run() -> None:
        # NumPy bounds-checks (mode="raise": [-n, n-1], negatives once from the end, as ONNX), so
        # an index computed on the device out of range is the user's InputError, not a plugin bug.
        try:
            take(idx, ax, o)
        except IndexError:
            raise device_error("gather", idx, x.shape[ax], ax) from None
    return run


def k_scatter_add(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, idx, upd = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    grids = list(np.indices(idx.shape, sparse=True))
    n = x.shape[ax]

    def run() -> None:
        np.copyto(o, x)
        if not idx.size:
            return
        # ONNX ScatterElements: [-n, n-1], negatives once from the end (NumPy's fancy indexing);
        # checked before any update so nothing is half-applied (it used to wrap modulo n).
        if int(idx.min()) < -n or int(idx.max()) >= n:
            raise device_error("scatter_add", idx, n, ax)
        g = list(grids)
        g[ax] = idx
        np.add.at(o, tuple(g), upd)
    return run


def k_iota(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    o = outs[0]
    if o.ndim == 0:
        return lambda: o.fill(0)
    ax = normalize_axis(attrs["axis"], o.ndim)  # type: ignore[arg-type]
    view = [1] * o.ndim
    view[ax] = o.shape[ax]
    return copy_run(o, np.arange(o.shape[ax]).reshape(view).astype(o.dtype))


def k_conv2d(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, w = ins
    o = outs[0]
    sh, sw = attrs["strides"]  # type: ignore[misc]
    pt, pl, pb, pr = attrs["pads"]  # type: ignore[misc]
    dh, dw = attrs["dilations"]  # type: ignore[misc]
    g = int(attrs["groups"])  # type: ignore[arg-type]
    n, c, h, wd = x.shape
    oc, ci, kh, kw = w.shape
    _, _, ho, wo = o.shape
    og = oc // g
    if x.dtype in (np.float32, np.float64) and x.size and o.size:
        from .conv import conv2d_float

        return conv2d_float(x, w, o, (sh, sw), (pt, pl, pb, pr), (dh, dw), g)
    padded = np.zeros((n, c, h + pt + pb, wd + pl + pr), x.dtype)
    inner = padded[:, :, pt:pt + h, pl:pl + wd]
    # Weights as (groups, og, ci*kh*kw) so each group is one GEMM over im2col columns.
    wmat = w.reshape(g, og, ci * kh * kw)
    acc = np.float64 if x.dtype.kind in "iub" else x.dtype

    def run() -> None:
        np.copyto(inner, x)
        win = np.lib.stride_tricks.sliding_window_view(padded, (dh * (kh - 1) + 1, dw * (kw - 1) + 1),
                                                       axis=(2, 3))
        win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]  # n, c, ho, wo, kh, kw
        cols = win.reshape(n, g, ci, ho, wo, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
        cols = cols.reshape(g, n * ho * wo, ci * kh * kw)
        if acc is not x.dtype:
            res = np.matmul(cols.astype(np.int64), wmat.astype(np.int64).transpose(0, 2, 1))
        else:
            res = np.matmul(cols, wmat.transpose(0, 2, 1))  # g, n*ho*wo, og
        res = res.reshape(g, n, ho, wo, og).transpose(1, 0, 4, 2, 3).reshape(n, oc, ho, wo)
        np.copyto(o, res, casting="unsafe")
    return run


def k_cumsum(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    if x.ndim == 0:
        return (lambda: o.fill(0)) if attrs["exclusive"] else (lambda: np.copyto(o, x))
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    rev = bool(attrs["reverse"])
    excl = bool(attrs["exclusive"])
    src = np.flip(x, ax) if rev else x
    dst = np.flip(o, ax) if rev else o

    acc = np.add.accumulate

    def run() -> None:
        acc(src, ax, o.dtype, dst)
        if excl:
            np.subtract(dst, src, out=dst)
    return run


def k_erf(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    return lambda: special.erf(x, out=o)


def k_sigmoid(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    return lambda: special.expit(x, out=o)


def k_sign(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]
    return lambda: np.sign(x, out=o)
