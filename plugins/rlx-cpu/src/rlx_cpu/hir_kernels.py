"""Native CPU kernels for model-level (HIR) ops: linear, softmax, log_softmax, layer_norm, rms_norm,
attention.

Claiming these natively (instead of their MIR decompositions) removes the materialised broadcasts
and extra passes over memory: a row-wise op makes two passes in one Numba loop, a linear is one
BLAS call with the bias added in place, attention is two batched GEMMs around an in-place masked
softmax. Small tensors use NumPy (no JIT latency); large ones the Numba row kernels (cached).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, normalize_axis, release_file_pages

ROWS_NUMBA_MIN = 32768
_NB: Any = None


def _numba_kernels() -> Any:
    global _NB
    if _NB is None:
        from . import _rows

        _NB = _rows
    return _NB


#: Rows up to this length, in tensors below SOFTMAX_NUMBA_MAX elements, run the compiled row
#: kernel on this thread: NumPy's four calls and per-row reduction cost dominate there (4x8x8
#: scores: 1.7 against 6.6 us; 8x4x8x8: 19 against 48 us, and 3.7 us since float32 rows take one
#: vectorised exp over all of them, ``softmax_rows_f32``). Larger tensors keep NumPy's SIMD exp
#: (the row kernel's scalar exp: 1.5 against 0.6 ms on 8x4x64x64).
SOFTMAX_ROW_MAX = 128
SOFTMAX_NUMBA_MAX = 16384


def k_softmax(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs, log: bool = False) -> Any:
    x, o = ins[0], outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    # NumPy's SIMD exp beats a scalar Numba loop ~2.5x here; the four passes stay in cache.
    # The row maxima and sums go to buffers made once, through the ufuncs' own reduce (np.max and
    # np.sum add ~1.5 us of Python a call: a third of a (1, 10) softmax).
    n = x.shape[ax] if x.ndim else 1
    if (ax == x.ndim - 1 and 0 < n <= SOFTMAX_ROW_MAX and 0 < x.size < SOFTMAX_NUMBA_MAX
            and x.flags.c_contiguous and o.flags.c_contiguous):
        nb = _numba_kernels()
        xr, orow = x.reshape(-1, n), o.reshape(-1, n)
        rows = xr.shape[0]
        if x.dtype == np.float32 and not log:
            t, s1, s2 = (np.empty(x.size, np.float32) for _ in range(3))
            ib = np.empty(x.size, np.int32)
            nb.softmax_rows_f32(xr, orow, t, ib, s1, s2, 0, 0)  # compile at bind time
            f32 = nb.softmax_rows_f32
            return lambda: f32(xr, orow, t, ib, s1, s2, 0, rows)
        nb.softmax_rows(xr, orow, log, 0, 0)  # compile at bind time
        fn = nb.softmax_rows
        return lambda: fn(xr, orow, log, 0, rows)
    red = tuple(1 if i == ax else d for i, d in enumerate(x.shape))
    m, s = np.empty(red, x.dtype), np.empty(red, x.dtype)
    vmax, vsum = np.maximum.reduce, np.add.reduce

    def run() -> None:
        vmax(x, axis=ax, keepdims=True, out=m)
        np.subtract(x, m, out=o)
        if log:
            vsum(np.exp(o), axis=ax, keepdims=True, out=s)
            np.log(s, out=s)
            np.subtract(o, s, out=o)
        else:
            np.exp(o, out=o)
            vsum(o, axis=ax, keepdims=True, out=s)
            np.divide(o, s, out=o)
    return run


def k_log_softmax(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    return k_softmax(ins, outs, attrs, log=True)


def k_layer_norm(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    x, gamma, beta = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    eps = float(attrs["eps"])  # type: ignore[arg-type]
    n = int(np.prod(x.shape[ax:], dtype=np.int64))
    if x.size > 0 and x.flags.c_contiguous and o.flags.c_contiguous and n > 0:
        nb = _numba_kernels()
        xr, orow = x.reshape(-1, n), o.reshape(-1, n)
        g, b = gamma.reshape(n), beta.reshape(n)
        from .parallel import split_rows

        nb.layer_norm_rows(xr, g, b, orow, eps, 0, 0)  # compile at bind time
        if x.size < ROWS_NUMBA_MIN:
            # Small rows on this thread: one compiled pass (~1 us for 8 rows of 32) where the
            # NumPy form below makes six calls and two temporaries (~15 us).
            fn, rows = nb.layer_norm_rows, xr.shape[0]
            return lambda: fn(xr, g, b, orow, eps, 0, rows)
        return split_rows(nb.layer_norm_rows, xr.shape[0], (xr, g, b, orow, eps), x.size,
                          rows_in=[xr], whole_in=[g, b], rows_out=[orow])
    axes = tuple(range(ax, x.ndim))

    def run() -> None:
        mu = np.mean(x, axis=axes, keepdims=True)
        np.subtract(x, mu, out=o)
        var = np.mean(np.square(o), axis=axes, keepdims=True)
        np.multiply(o, 1.0 / np.sqrt(var + eps), out=o)
        np.multiply(o, gamma, out=o)
        np.add(o, beta, out=o)
    return run


def k_rms_norm(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    """``x / sqrt(mean(x^2) + eps) * gamma``: one compiled pass a row (what LLaMA-family exports
    spell as five to seven primitives), the row pool above ``ROWS_NUMBA_MIN`` elements."""
    x, gamma = ins
    o = outs[0]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    eps = float(attrs["eps"])  # type: ignore[arg-type]
    n = int(np.prod(x.shape[ax:], dtype=np.int64))
    if x.size > 0 and x.flags.c_contiguous and o.flags.c_contiguous and n > 0:
        nb = _numba_kernels()
        xr, orow, g = x.reshape(-1, n), o.reshape(-1, n), gamma.reshape(n)
        nb.rms_norm_rows(xr, g, orow, eps, 0, 0)  # compile at bind time
        if x.size < ROWS_NUMBA_MIN:
            fn, rows = nb.rms_norm_rows, xr.shape[0]
            return lambda: fn(xr, g, orow, eps, 0, rows)
        from .parallel import split_rows

        return split_rows(nb.rms_norm_rows, xr.shape[0], (xr, g, orow, eps), x.size,
                          rows_in=[xr], whole_in=[g], rows_out=[orow])
    axes = tuple(range(ax, x.ndim))

    def run() -> None:
        ms = np.mean(np.square(x, dtype=np.float64), axis=axes, keepdims=True)
        np.multiply(x, 1.0 / np.sqrt(ms + eps), out=o, casting="unsafe")
        np.multiply(o, gamma, out=o)
    return run


def k_linear(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    x, w, b = ins
    o = outs[0]
    # A constant weight (read-only: the program's own copy never changes) is re-laid out once as
    # a C-contiguous (in, out) matrix: OpenBLAS runs x @ W faster than x @ W.T with W row-major
    # (`python bench/profile_cpu.py --gemm`: 5-10% at 128 rows, 1-4% at 1024; MiniLM end to end
    # 3-4%) at the price of one more copy of the linear weights in memory.
    wt = np.ascontiguousarray(w.T) if not w.flags.writeable and w.ndim == 2 else w.T
    if not w.flags.writeable and wt.flags.writeable:
        wt.flags.writeable = False  # still a constant: row chains need no barrier to read it
        release_file_pages(w)  # the copy is what runs: a memory-mapped original's pages leave the RSS
    if x.ndim > 2 and x.flags.c_contiguous and o.flags.c_contiguous:
        # One GEMM over all rows: NumPy runs a stacked matmul as one small GEMM per leading index.
        x = x.reshape(-1, x.shape[-1])
        o = o.reshape(-1, o.shape[-1])

    team = _team_linear(x, w, b, o)
    if team is not None:
        return team
    par = _pool_linear(x, wt, b, o)
    if par is not None:
        return par
    one = _one_thread_gemv(x, wt, b, o)
    if one is not None:
        return one

    from .blas import numpy_gemm

    gemm, add = numpy_gemm(x, wt, o), np.add

    def run() -> None:
        gemm(x, wt, out=o)
        add(o, b, out=o)
    return run


#: Rows up to which a big constant float32 linear runs as the dense path's oneDNN matmul primitive
#: on the OpenMP team (:func:`_team_linear`) where the program loaded oneDNN.
TEAM_ROWS = 16


def _team_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray, o: np.ndarray) -> Any:
    """A big constant float32 linear of at most :data:`TEAM_ROWS` rows (a CNN's classifier) as the
    dense path's oneDNN matmul primitive on the OpenMP team, where a program of convs loaded oneDNN:
    its weights packed once and each read by one core. The row pieces re-read (and sgemm re-packed)
    every weight for each piece: mobilenet_v3_small's 576 -> 1024 classifier at batch 8 took
    316-520 us there and 72-73 us here, ResNet-18's 512 -> 1000 at batch 8 281-445 against 57-59
    (``python bench/cpu_call_overhead.py``, its classifier rows, two runs)."""
    from . import blas, dense, settings
    from .parallel import pool

    if (x.ndim != 2 or o.ndim != 2 or x.shape[0] > TEAM_ROWS or w.flags.writeable
            or x.shape[0] * w.size < dense.TEAM_MIN_MACS or not settings.DENSE_OPENMP.get()
            or not blas.dnnl_loaded() or pool().threads < 2):
        return None
    from .onednn_linear import linear_team

    return linear_team(x, w, b, o, False, pool())


def _one_thread_gemv(x: np.ndarray, wt: np.ndarray, b: np.ndarray, o: np.ndarray) -> Any:
    """1-2 rows of a float32 linear on oneDNN's sgemm on the calling thread, where oneDNN is
    already loaded (a program of convs or bigger linears; MLP-only programs bind in rlx_cpu.dense
    and load nothing). NumPy's threaded OpenBLAS split such a GEMV over both cores and its threads
    then kept spinning, taking the second core from the row pool's next steps: ResNet-18 at batch 1
    ran 35-39 ms a call with its classifier there and 19-22 ms with OPENBLAS_NUM_THREADS=1."""
    from . import blas

    if (x.ndim != 2 or o.ndim != 2 or x.shape[0] > GEMV_ROWS or b.ndim != 1 or x.dtype != np.float32
            or x.shape[0] * wt.size <= NUMPY_GEMV_MAX or not blas.dnnl_loaded()):
        return None
    gemm = blas.dnnl_gemm_fn(x, wt, o)
    if gemm is None:
        return None
    m = x.shape[0]

    def run() -> None:
        gemm(0, m)
        np.add(o, b, out=o)
    return run


#: Rows per thread from which a GEMM runs on the private OpenBLAS split by rows over the pool
#: (without oneDNN). Below it (MiniLM at batch 1: 128 rows) NumPy's threaded OpenBLAS was faster
#: here (22.7-23.8 vs 25.9 ms end to end), above it the row split was (146-150 vs 156-161 ms at
#: batch 8).
ROW_SPLIT_MIN = 256
#: Multiply-adds from which a oneDNN GEMM is split over the pool when it runs alone: a hand-off
#: costs ~20 us at the median (``python bench/profile_cpu.py --pool``), 4M multiply-adds ~70 us
#: on one core at oneDNN's ~110 GFLOP/s (``--libs``).
SPLIT_MIN_MACS = 4_000_000
#: Rows up to which a linear is left to NumPy's matmul (OpenBLAS's GEMV-like path): as fast as
#: oneDNN there (784x512 weights: 21-29 us either way at 1-2 rows; at 4 rows OpenBLAS 88-114 vs
#: oneDNN 35 us), and a program of such linears never loads oneDNN, OpenMP or Numba (MLP
#: 784-512-256-10 at batch 1: 248 instead of 379 MB peak RSS).
GEMV_ROWS = 2
#: Multiply-adds up to which a 1-2 row linear stays on NumPy even where oneDNN is loaded: OpenBLAS
#: runs a GEMV below 2304 x 4 elements of weights on the calling thread (its own threshold, so no
#: thread spins), where the ctypes call to oneDNN with its OpenMP thread-count swap costs more
#: (conv1d_audio's 32 x 6 classifier: 4.85 -> 1.83 us a call, ``bench/cpu_call_overhead.py``).
NUMPY_GEMV_MAX = 9216


#: Rows up to which a linear split over the pool calls oneDNN through ctypes rather than the Numba
#: kernel (:mod:`rlx_cpu._gemm_rows`); 0 restores the Numba kernel for all.
CTYPES_ROWS = 16


def _pool_linear(x: np.ndarray, wt: np.ndarray, b: np.ndarray, o: np.ndarray) -> Any:
    """``o = x @ wt + b`` as a :class:`~rlx_cpu.parallel.RowRun`: each row piece one
    single-threaded GEMM plus its rows of the bias add while they are still in cache; None where
    NumPy's threaded BLAS is the better choice."""
    from . import blas
    from .parallel import RowRun, pool

    if x.ndim != 2 or o.ndim != 2 or b.ndim != 1:
        return None
    m, k, n = o.shape[0], x.shape[1], o.shape[1]
    if m <= GEMV_ROWS:
        return None
    threads = pool().threads
    if blas.onednn(x.dtype):
        parts = threads if m * n * k >= SPLIT_MIN_MACS and m >= 2 * threads else 1
    else:
        parts = threads if m >= ROW_SPLIT_MIN * threads and m * n * k >= 64 * 262144 * threads else 1
        if parts < 2:
            return None
    # A big linear of few rows (a CNN's classifier at batch 8) calls oneDNN through ctypes: the
    # ~1 us a call costs more is noise next to its >= 4M multiply-adds, and a program with no other
    # Numba kernel then loads no Numba/LLVM (~117 MB of RSS). Same results: the same sgemm calls on
    # the same row pieces, then the same float32 bias add.
    few = m <= CTYPES_ROWS and m * n * k >= SPLIT_MIN_MACS
    native = None if few else blas.linear_rows(x, wt, b, o)
    if native is not None:
        rows, args = native
    else:
        gemm = (blas.dnnl_gemm_fn(x, wt, o) if few else None) or blas.gemm_fn(x, wt, o)
        if gemm is None:
            return None

        def rows(lo: int, hi: int) -> None:
            gemm(lo, hi)
            np.add(o[lo:hi], b, out=o[lo:hi])
        args = ()

    # Pieces of >= 512 rows keep the GEMM at its single-core peak (MiniLM batch 8 on OpenBLAS: two
    # 512-row pieces 139-143 ms, four 146-152, eight 158-160); beyond that, more pieces than
    # threads let a thread on a shared core take fewer of them.
    cpt = max(1, min(4, m // (512 * threads)))
    by_rows = x.flags.c_contiguous  # else x is read through a transposed BLAS operand
    return RowRun(rows, m, args, m * n * k // 64, chunks_per_thread=cpt, parts=parts,
                  rows_in=[x] if by_rows else [], whole_in=[wt, b] if by_rows else [wt, b, x],
                  rows_out=[o])


def attention_supported(v: Any) -> str | None:
    mask = v.attrs["mask"]
    if mask not in ("none", "causal", "padding", "bias"):
        return f"mask {mask!r} runs through the decomposition"
    q, k, val = v.in_types[:3]
    if q.rank != 4 or k.rank != 4 or val.rank != 4:
        return "native attention takes (B, H, S, D) operands"
    if mask == "padding" and (v.in_types[3].rank != 2 or (not v.in_types[3].dtype.is_float
                              and v.in_types[3].dtype.value not in ("bool", "i32", "i64"))):
        return "padding mask must be (B, Sk)"
    if mask == "bias" and v.in_types[3].dtype != q.dtype:
        return "bias mask must have the query dtype"
    return None


def k_attention(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from rlx_core.plugin import masked_score

    q, k, v = ins[:3]
    o = outs[0]
    bsz, h, sq, d = q.shape
    sk = k.shape[2]
    mask = attrs["mask"]
    given = attrs["scale"]
    if given is not None and not isinstance(given, (int, float)):
        raise TypeError(f"attention: attribute 'scale' = {given!r} is not a number")
    scale = float(given) if given is not None else 1.0 / math.sqrt(d)
    dt = q.dtype
    scores = np.empty((bsz, h, sq, sk), dt)
    kt = k.swapaxes(-1, -2)
    neg = float(masked_score(_dtype(dt)))
    add: np.ndarray | None = None
    keep: np.ndarray | None = None
    if mask == "causal":
        keep = np.tril(np.ones((sq, sk), bool))
    elif mask == "bias":
        add = ins[3]
    elif mask == "padding":
        pm = ins[3]
        keep_src = pm
    # The Numba kernel writes q's head size per output row, so v with another head size (as
    # ONNX FlexAttention/Attention allow) takes the NumPy path.
    if (dt in (np.float32, np.float64) and mask in ("none", "causal", "padding", "bias")
            and v.shape[-1] == d and all(x.flags.c_contiguous for x in (q, k, v, o))):
        return _attention_numba(q, k, v, o, mask, ins[3] if mask in ("padding", "bias") else None,
                                scale, neg)
    qs = np.empty_like(q)
    sc = np.asarray(scale, dt)

    def run() -> None:
        # Scale q first (as the decomposition does) so f16-range scores cannot overflow.
        np.multiply(q, sc, out=qs)
        np.matmul(qs, kt, out=scores)
        if keep is not None:
            np.copyto(scores, neg, where=~keep)
        elif add is not None:
            np.add(scores, add, out=scores)
        elif mask == "padding":
            kp = (keep_src != 0).reshape(bsz, 1, 1, sk)
            np.copyto(scores, neg, where=~kp)
        np.subtract(scores, scores.max(axis=-1, keepdims=True), out=scores)
        np.exp(scores, out=scores)
        np.divide(scores, scores.sum(axis=-1, keepdims=True), out=scores)
        np.matmul(scores, v, out=o)
    return run


def _attention_numba(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, mask: str,
                     pad: np.ndarray | None, scale: float, neg: float) -> Any:
    from . import _attention as na
    from .parallel import split_rows
    bsz, h, sq, d = q.shape
    nblk = (sq + na.QBLOCK - 1) // na.QBLOCK
    n = bsz * h * nblk
    mode = {"none": na.MASK_NONE, "causal": na.MASK_CAUSAL, "padding": na.MASK_PADDING,
            "bias": na.MASK_BIAS}[mask]
    keep = pad if mask == "padding" else np.ones((1, 1), np.uint8)
    # The bias as a (B, H, Sq, Sk) view (zero strides where it broadcasts); a dummy otherwise.
    bias = (np.broadcast_to(pad, (bsz, h, sq, k.shape[2])) if mask == "bias" and pad is not None
            else np.broadcast_to(np.zeros((1,) * 4, q.dtype), (1,) * 4))
    args = (q, k, v, keep, bias, mode, q.dtype.type(scale), q.dtype.type(neg), o)
    if runs_across(bsz * h, sq, k.shape[2], d, d):
        args = (q, k.swapaxes(2, 3), *args[2:])  # the keys as the across kernels gather them
        na.attention_across(*args, 0, 0)  # compile (or load from the disk cache) at bind time
        return split_rows(na.attention_across, bsz * h, args, bsz * h * sq * k.shape[2] * d // 8,
                          whole_in=[q, k, v, keep, bias], rows_out=[o.reshape(bsz * h, -1)])
    na.attention_items(*args, 0, 0)  # compile (or load from the disk cache) at bind time
    # Item it writes o[b, h, block]: with whole blocks those are rows of an (items, block) view,
    # which lets attention join a row chain (it reads q, k, v and the mask whole).
    rows_out = [o.reshape(n, -1)] if sq % na.QBLOCK == 0 else []
    # Work counted per score element times the head size: an item is two GEMMs and a softmax, so
    # batch 1 (12 x 128 x 128 scores) is split too.
    return split_rows(na.attention_items, n, args, bsz * h * sq * k.shape[2] * d // 8,
                      whole_in=[q, k, v, keep, bias], rows_out=rows_out)


def _dtype(npdt: np.dtype) -> Any:
    from rlx_core.plugin import DType

    return DType.parse(npdt)


def bind_guarded_attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray, bias: np.ndarray,
                           c1: np.ndarray, c2: np.ndarray, o: np.ndarray) -> Any:
    """The run of an exporter's masked attention chain (``rlx_cpu.program``): one compiled pass
    over the (batch, head) items, on this thread for small work, else over the row pool."""
    from . import _attention as na
    from .parallel import split_rows

    bsz, h, sq, d = q.shape
    sk = kt.shape[3]
    full = np.broadcast_to(bias.reshape((1,) * (4 - bias.ndim) + bias.shape), (bsz, h, sq, sk))
    s1, s2 = q.dtype.type(np.asarray(c1).reshape(())), q.dtype.type(np.asarray(c2).reshape(()))
    args = (q, kt, v, full, s1, s2, o)
    n = bsz * h
    fn = na.guarded_across if runs_across(n, sq, sk, d, v.shape[3]) else na.guarded_items
    fn(*args, 0, 0)  # compile (or load from the disk cache) at bind time
    work = n * sq * sk * (d + v.shape[3])
    if work < SPLIT_MIN_MACS // 4:
        return lambda: fn(*args, 0, n)
    return split_rows(fn, n, args, work // 8, whole_in=[q, kt, v, full])


#: (batch, head) items from which tiny-head attention runs across the items (``guarded_across``,
#: ``attention_across``), and the most keys it does that for.
ACROSS_MIN_ITEMS = 16
ACROSS_MAX_KEYS = 16


def runs_across(items: int, sq: int, sk: int, d: int, dv: int) -> bool:
    """Whether attention runs with the items innermost: many tiny heads. With fewer items or more
    keys the per-item loops were as fast or faster (17 keys: even or slower, padding/bias masks)."""
    return items >= ACROSS_MIN_ITEMS and sk <= ACROSS_MAX_KEYS and max(sq, d, dv) <= 32
