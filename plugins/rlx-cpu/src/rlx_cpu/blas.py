"""rlx-cpu's own GEMMs: oneDNN's sgemm for float32, a private single-threaded OpenBLAS otherwise.

Why oneDNN for float32: its JIT AVX-512/AVX2 sgemm runs 107-114 GFLOP/s a core on MiniLM's shapes
on this project's 2-core CI machine (an AMD EPYC with AVX-512), NumPy's OpenBLAS 94-104
(``python bench/profile_cpu.py --libs``). It comes from the pinned ``onednn-cpu-gomp`` wheel (Apache-2.0),
loaded ``RTLD_LOCAL``; each call runs on the calling thread only (OpenMP's per-thread thread count is
set to 1 around the call and restored), so the row pool, not OpenMP, spreads the work.
``RLX_CPU_ONEDNN=0`` turns it off; where the wheel is missing (not x86-64 Linux) OpenBLAS does all.

Why private: NumPy's OpenBLAS has its own worker threads, which spin for ~0.1 s after every GEMM.
On a 2-core machine they sit on the core the row pool wants next, so elementwise, layer-norm and
attention kernels split over threads ran no faster than on one. A second copy of the same library,
loaded under another file name with ``RTLD_LOCAL``, has separate globals: it is set to one thread
here and never touches NumPy's instance (user code keeps NumPy's threading as it was). All rlx-cpu
parallelism then comes from :mod:`rlx_cpu.parallel`, whose workers block instead of spinning.

The library is the one NumPy ships (``numpy.libs/libscipy_openblas64_*``); it is copied once into
the RLX cache (``cpu-blas``, authenticated before every dlopen). Where it cannot be found (another
NumPy build) :func:`available` is false and kernels use ``np.matmul``. ``RLX_CPU_PRIVATE_BLAS=0``
turns both libraries off.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import tempfile
import threading
from typing import Any

import numpy as np

from rlx_core.plugin import release_library_pages

from . import settings


def numpy_gemm(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Any:
    """NumPy's GEMM call for ``out = x @ w``: ``np.dot`` on 2-D operands (the same BLAS call at
    ~0.4 us less than the matmul ufunc: 8x256 @ 256x10 1.6 against 2.0 us), where it takes
    ``out`` (C-contiguous, the result's dtype, not overlapping an operand), else ``np.matmul``."""
    if (x.ndim == w.ndim == out.ndim == 2 and out.flags.c_contiguous and x.dtype == w.dtype == out.dtype
            and not np.may_share_memory(out, x) and not np.may_share_memory(out, w)):
        return np.dot
    return np.matmul

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_DNNL_OP = {_NO_TRANS: ord("N"), _TRANS: ord("T")}  # dnnl_sgemm's transa/transb characters
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _library() -> str | None:
    base = os.path.dirname(np.__file__)
    for pat in (os.path.join(base, os.pardir, "numpy.libs", "libscipy_openblas64_*.so*"),):
        hits = sorted(glob.glob(pat))
        if hits:
            return os.path.realpath(hits[0])
    return None


def _private_copy(src: str) -> tuple[str, bool]:
    """(a copy of ``src`` under another file name, is it temporary). The cached copy is dlopened only
    after its MAC sidecar matched (a planted library is deleted and copied again); verify-then-dlopen
    is race-free only because the ``cpu-blas`` directory is one only the user can write. Without a
    usable cache the copy goes to a private temporary directory and is unlinked once loaded."""
    from rlx_core.plugin import cache_subdir, publish_file, verify_file

    d = cache_subdir("cpu-blas", about="rlx-cpu private OpenBLAS copy (dlopened)")
    if d is None:
        fd, dst = tempfile.mkstemp(prefix="rlx_openblas_", suffix=".so")  # 0600, ours
        os.close(fd)
        shutil.copyfile(src, dst)
        return dst, True
    # Keyed by the library's file name and size, not its path: NumPy's wheels name it after a hash
    # of its contents (auditwheel's libscipy_openblas64_-<hash>.so), so every virtual environment
    # with the same NumPy build shares one copy (keyed by path, each venv added 25 MB).
    tag = hashlib.sha256(f"{os.path.basename(src)}|{os.path.getsize(src)}".encode()).hexdigest()[:16]
    cached = d / f"rlx_openblas_{tag}.so"
    if not verify_file(cached):
        tmp = d / f".tmp-{cached.name}.{os.getpid()}"
        shutil.copyfile(src, tmp)
        if not publish_file(tmp, cached):  # the cache went away meanwhile: load the private copy
            return str(tmp), True
        # One copy at a time: older ones (another NumPy) go. A process that has one loaded keeps
        # its mapping; one that needs it again copies it back (~25 MB, once).
        for old in d.glob("rlx_openblas_*.so*"):
            if old.name not in (cached.name, cached.name + ".mac"):
                old.unlink(missing_ok=True)
    return str(cached), False


def _load() -> dict[str, Any]:
    with _LOCK:
        if _STATE:
            return _STATE
        _STATE["ok"] = False
        if not settings.PRIVATE_BLAS.get():
            _STATE["why"] = "RLX_CPU_PRIVATE_BLAS=0"
            return _STATE
        src = _library()
        if src is None:
            _STATE["why"] = "NumPy's bundled OpenBLAS was not found (not a PyPI NumPy wheel)"
            return _STATE
        try:
            path, temporary = _private_copy(src)
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
                release_library_pages(path)  # 2.4 MB touched by its loader, mostly never run again
            finally:
                if temporary:  # the mapping stays valid after the file is gone
                    os.unlink(path)
            setn = lib.scipy_openblas_set_num_threads64_
            sg, dg = lib.scipy_cblas_sgemm64_, lib.scipy_cblas_dgemm64_
        except (OSError, AttributeError) as e:
            _STATE["why"] = f"could not load a private OpenBLAS: {e}"
            return _STATE
        setn.argtypes, setn.restype = [ctypes.c_int], None
        setn(1)
        i64, ci, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        for fn, real in ((sg, ctypes.c_float), (dg, ctypes.c_double)):
            fn.restype = None
            fn.argtypes = [ci, ci, ci, i64, i64, i64, real, vp, i64, vp, i64, real, vp, i64]
        _STATE.update(ok=True, lib=lib, gemm={np.dtype(np.float32): sg, np.dtype(np.float64): dg})
        _STATE["dnnl"], _STATE["dnnl_why"] = _load_dnnl()
        if "libs" in _DNNL:  # the libraries' handles, for rlx_cpu.onednn_conv
            _STATE["dnnl_libs"] = _DNNL["libs"]
        return _STATE


def _load_dnnl() -> tuple[tuple[int, int, int] | None, str]:
    """(the addresses of dnnl_sgemm, omp_get_max_threads and omp_set_num_threads, for
    :mod:`rlx_cpu._gemm_rows`; or None and why not). Loaded once: also without the private
    OpenBLAS (:func:`dnnl_gemm_fn`)."""
    with _DNNL_LOCK:
        if "fns" not in _DNNL:
            _DNNL["fns"] = _open_dnnl()
        fns: tuple[tuple[int, int, int] | None, str] = _DNNL["fns"]
        return fns


_DNNL: dict[str, Any] = {}
_DNNL_LOCK = threading.Lock()


def dnnl_loaded() -> bool:
    """Whether oneDNN is loaded in this process already (asks nothing to load it)."""
    fns = _DNNL.get("fns")
    return fns is not None and fns[0] is not None


def _open_dnnl() -> tuple[tuple[int, int, int] | None, str]:
    if not settings.ONEDNN.get():
        return None, "RLX_CPU_ONEDNN=0"
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("onednn-cpu-gomp").files or []
    except PackageNotFoundError:
        return None, "the onednn-cpu-gomp wheel is not installed"
    libs = sorted(str(f.locate()) for f in files if f.name.startswith("libdnnl.so"))
    if not libs:
        return None, "the onednn-cpu-gomp wheel has no libdnnl.so"
    try:
        lib = ctypes.CDLL(libs[-1], mode=os.RTLD_LOCAL)
        omp = ctypes.CDLL("libgomp.so.1")  # the OpenMP runtime libdnnl was linked against
        fns = (lib.dnnl_sgemm, omp.omp_get_max_threads, omp.omp_set_num_threads)
    except (OSError, AttributeError) as e:
        return None, f"could not load oneDNN: {e}"
    release_library_pages(libs[-1])  # its loader touched 18 MB of code; an sgemm needs little of it
    _DNNL["libs"] = (lib, omp)  # the addresses stay valid while the libraries stay loaded
    a, b, c = (int(ctypes.cast(f, ctypes.c_void_p).value or 0) for f in fns)
    return (a, b, c), ""


def onednn(dtype: Any) -> bool:
    """Do rlx-cpu's GEMMs of ``dtype`` run on oneDNN (float32 with the wheel loaded)?"""
    return np.dtype(dtype) == np.float32 and _load().get("dnnl") is not None


def dnnl_fns() -> tuple[int, int, int]:
    """(dnnl_sgemm, omp_get_max_threads, omp_set_num_threads) addresses for Numba kernels that call
    oneDNN themselves; only where :func:`onednn` is true for float32."""
    fns = _load().get("dnnl")
    assert fns is not None, "dnnl_fns() without oneDNN: check blas.onednn(np.float32) first"
    return fns


def library(dtype: Any) -> str:
    """Which library runs rlx-cpu's GEMMs of ``dtype`` (for benchmark reports)."""
    st = _load()
    if not st["ok"]:
        return f"NumPy (np.matmul): {st['why']}"
    return "oneDNN sgemm" if onednn(dtype) else "private OpenBLAS"


def available() -> bool:
    return bool(_load()["ok"])


def _ld(a: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D operand, or None if BLAS cannot read it."""
    isz = a.itemsize
    s0, s1 = a.strides
    if s1 == isz and s0 % isz == 0 and s0 >= max(1, a.shape[1]) * isz:
        return _NO_TRANS, s0 // isz
    if s0 == isz and s1 % isz == 0 and s1 >= max(1, a.shape[0]) * isz:
        return _TRANS, s1 // isz
    return None


def _layout(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[int, int, int, int] | None:
    """(transa, lda, transb, ldb) for ``c = a @ b`` in row-major BLAS terms, or None if BLAS
    cannot read the operands or write ``c``."""
    if a.ndim != 2 or b.ndim != 2 or c.ndim != 2 or c.strides[1] != c.itemsize or c.strides[0] % c.itemsize:
        return None
    la, lb = _ld(a), _ld(b)
    if la is None or lb is None:
        return None
    return la[0], la[1], lb[0], lb[1]


def linear_rows(x: np.ndarray, w: np.ndarray, bias: np.ndarray,
                o: np.ndarray) -> tuple[Any, tuple[Any, ...]] | None:
    """``(fn, args)`` with ``fn(*args, lo, hi)`` computing rows ``lo:hi`` of ``o = x @ w + bias`` in
    one nogil call into oneDNN (:mod:`rlx_cpu._gemm_rows`), or None where oneDNN cannot."""
    lay = _layout(x, w, o)
    if (lay is None or not all(t.dtype == np.float32 for t in (x, w, bias, o)) or not onednn(np.float32)
            or bias.shape != (o.shape[1],) or bias.strides[0] != 4):
        return None
    from ._gemm_rows import linear_rows as fn

    ta, lda, tb, ldb = lay
    args = (_STATE["dnnl"], _DNNL_OP[ta], _DNNL_OP[tb], x, lda, lda if ta == _NO_TRANS else 1, w, ldb,
            bias, o)
    fn(*args, 0, 0)  # compile (or load from the disk cache) at bind time
    return fn, args


def dnnl_gemm_fn(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: Any = None) -> Any:
    """Like :func:`gemm_fn`, float32 on oneDNN only, called through ctypes instead of the Numba
    trampoline, and without loading the private OpenBLAS: for programs that need neither (Numba
    and LLVM are ~85 MB of RSS, the OpenBLAS copy ~6 MB; a call costs ~1 us more). None where
    oneDNN is off or missing, or cannot read the operands. ``threads``: a function giving the
    OpenMP threads for each call (default one: the row pool spreads the work)."""
    if not settings.PRIVATE_BLAS.get() or not (a.dtype == b.dtype == c.dtype == np.float32):
        return None
    if _load_dnnl()[0] is None:
        return None
    lay = _layout(a, b, c)
    if lay is None:
        return None
    ta, lda, tb, ldb = lay
    return _dnnl_ctypes(ta, lda, lda if ta == _NO_TRANS else 1, tb, ldb, a, b, c, threads)


def gemm_fn(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Any:
    """A closure ``f(lo, hi)`` computing rows ``lo:hi`` of ``c = a @ b`` on the calling thread
    (oneDNN for float32, else the private OpenBLAS; GIL released), or None if it cannot."""
    st = _load()
    if not st["ok"] or a.dtype != b.dtype or a.dtype != c.dtype or a.dtype not in st["gemm"]:
        return None
    lay = _layout(a, b, c)
    if lay is None:
        return None
    ta, lda, tb, ldb = lay
    a_row = lda if ta == _NO_TRANS else 1  # elements from row lo of a to row lo + 1
    if a.dtype == np.float32 and st["dnnl"] is not None:
        from ._gemm_rows import gemm_rows

        fns, tra, trb = st["dnnl"], _DNNL_OP[ta], _DNNL_OP[tb]

        def run_dnnl(lo: int, hi: int) -> None:
            gemm_rows(fns, tra, trb, a, lda, a_row, b, ldb, c, lo, hi)
        return run_dnnl
    fn = st["gemm"][a.dtype]
    ldc = c.strides[0] // c.itemsize
    k, n, isz = a.shape[1], c.shape[1], a.itemsize
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    keep = (a, b, c)  # the raw pointers below stay valid while this closure lives

    def run(lo: int, hi: int) -> None:
        if hi <= lo or keep is None:
            return
        fn(_ROW_MAJOR, ta, tb, hi - lo, n, k, 1.0, pa + lo * a_row * isz, lda, pb, ldb, 0.0,
           pc + lo * ldc * isz, ldc)
    return run


def _dnnl_ctypes(ta: int, lda: int, a_row: int, tb: int, ldb: int, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray, threads: Any = None) -> Any:
    """:func:`dnnl_gemm_fn`'s closure (what :func:`rlx_cpu._gemm_rows.gemm_rows` does, without
    Numba): one OpenMP thread for the call (or ``threads()``), the caller's count put back after."""
    sgemm, get_max, set_num = _dnnl_ctypes_fns()
    k, n, isz = a.shape[1], c.shape[1], 4
    ldc = c.strides[0] // isz
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    tra, trb = bytes([_DNNL_OP[ta]]), bytes([_DNNL_OP[tb]])
    keep = (a, b, c)  # the raw pointers below stay valid while this closure lives

    def run(lo: int, hi: int) -> None:
        if hi <= lo or keep is None:
            return
        want = 1 if threads is None else threads()
        prev = get_max()
        if prev != want:  # one OpenMP thread for this call: the row pool spreads the work
            set_num(want)
        try:
            st = sgemm(tra, trb, hi - lo, n, k, 1.0, pa + lo * a_row * isz, lda, pb, ldb, 0.0,
                       pc + lo * ldc * isz, ldc)
        finally:
            if prev != want:
                set_num(prev)
        if st != 0:
            raise RuntimeError("oneDNN sgemm failed; set RLX_CPU_ONEDNN=0 to use OpenBLAS and report it")
    return run


def _dnnl_ctypes_fns() -> tuple[Any, Any, Any]:
    """(dnnl_sgemm, omp_get_max_threads, omp_set_num_threads) as ctypes functions (GIL released
    during each call), made once."""
    fns = _DNNL.get("ctypes")
    if fns is None:
        lib, omp = _DNNL["libs"]
        sgemm = lib.dnnl_sgemm
        i64, f32, vp, ch = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_char
        sgemm.restype = ctypes.c_int
        sgemm.argtypes = [ch, ch, i64, i64, i64, f32, vp, i64, vp, i64, f32, vp, i64]
        get_max, set_num = omp.omp_get_max_threads, omp.omp_set_num_threads
        get_max.restype, get_max.argtypes = ctypes.c_int, []
        set_num.restype, set_num.argtypes = None, [ctypes.c_int]
        fns = _DNNL["ctypes"] = (sgemm, get_max, set_num)
    return fns
