"""float32 conv2d on oneDNN's convolution primitive (direct JIT kernels on blocked layouts).

Why: rlx-cpu's im2col + GEMM (:mod:`rlx_cpu.conv`) copies every input KH*KW times and runs GEMMs of
awkward shapes (ResNet-18's 7x7 convs: 49 columns); oneDNN's direct kernels (like ONNX Runtime's
MLAS NCHWc ones) read the input once in channel-blocked layouts and keep output tiles in
registers. The primitive picks its layouts (format "any": NHWC or nChw16c here); the weights are
reordered into its layout once when the kernel is bound (the program owns the copy; weights that
are not constants are reordered every run) and the NCHW activations are reordered at the edges of
each conv, into this thread's conv scratch. Bias, a residual (oneDNN's sum post-op) and an
activation (ReLU, SiLU, HardSwish) are applied while the output tile is in registers
(:mod:`rlx_cpu.conv_fusion` makes the ops).

oneDNN comes from the optional ``onednn-cpu-gomp`` wheel that :mod:`rlx_cpu.blas` already loads
(``RLX_CPU_ONEDNN=0`` turns it off); without it, or where the primitive refuses a shape,
:func:`conv2d_onednn` returns None and the im2col path runs. The library is reached through its C
API with ctypes (no headers, no compiler); every call releases the GIL.

Threads: by default (``RLX_CPU_CONV_OPENMP``) a conv is one primitive on an OpenMP team of the
threads the load leaves (:attr:`rlx_cpu.parallel.RowPool.active`; a primitive is made once per
thread count, and oneDNN's forward convs give the same bits for every count). Measured 2026-12-02 in
one process, blocks alternating: DeepLabV3-MobileNetV3 (its ASPP branches are lone convs) b1 2.33 ->
1.92 ms, b8 9.40 -> 7.57; ConvNeXt (tiny config) b8 1.01 -> 0.92; transformer exports with a patch or
audio conv unchanged. With the setting off a conv is cut into pieces (whole images; at batch 1
output channels or output rows) that run as one-thread primitives on rlx-cpu's row pool
(:mod:`rlx_cpu.parallel`), so libgomp never opens a team: the earlier design, chosen when the team's
spinning worker slowed the row pool's next steps (quiet ResNet-18 at batch 1 went from 31 ms with
im2col to 47-52 ms); the convs of CNNs now run inside conv chains on the same team.
``ROW_POOL = False`` forces the team whatever the setting (``bench/conv_ab.py``).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.plugin import RLXError, release_file_pages

from . import native, settings
from .parallel import PerTeam, RowPool, pool

Run = Callable[[], None]
#: The activation after the conv: "", "relu", "silu", or ("hardswish", alpha, beta) for
#: ``y * min(max(alpha * y + beta, 0), 1)``; "relu_drops_nan" is oneDNN's own relu, which turns NaN
#: into 0 (for values that cannot hold one: ``rlx_cpu.conv_chain.FINITE_RELU``).
Act = str | tuple[str, float, float]

# oneDNN v3 C API constants (oneapi/dnnl/dnnl_types.h, dnnl_common_types.h).
_F32 = 3  # dnnl_f32
_TAG_ANY = 1  # dnnl_format_tag_any
_CPU = 1  # dnnl_cpu
_IN_ORDER = 1  # dnnl_stream_in_order
_FWD_INFERENCE = 0x60  # dnnl_forward_inference
_CONV_DIRECT = 0x1  # dnnl_convolution_direct
_ELTWISE_RELU = 0x20  # dnnl_eltwise_relu
_ELTWISE_ELU, _ELTWISE_LINEAR, _ELTWISE_SWISH = 0x22, 0x26, 0x2C  # dnnl_eltwise_elu, _linear, _swish (v3)
_ELTWISE_HARDSWISH = 0x34  # dnnl_eltwise_hardswish
_ELTWISE_CLIP = 0x2E  # dnnl_eltwise_clip: min(max(x, alpha), beta)
_POOLING_MAX = 0x1FF  # dnnl_pooling_max
_DT_UNDEF = 0  # dnnl_data_type_undef: the sum post-op reads the destination's type
_QUERY_EXEC_ARG_MD = 255  # dnnl_query_exec_arg_md (index: a DNNL_ARG_*)
_QUERY_IMPL_INFO = 8  # dnnl_query_impl_info_str
_QUERY_DIMS = 257  # dnnl_query_dims (a memory descriptor's dims)
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS, _ARG_SCRATCHPAD = 1, 17, 33, 41, 80
_SCRATCHPAD_USER = 1  # dnnl_scratchpad_mode_user
_ARG_FROM, _ARG_TO = 1, 17
_MAX_DIMS = 12

_Dims = ctypes.c_int64 * _MAX_DIMS
_VP = ctypes.c_void_p


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _VP)]


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


class OneDNNError(RLXError):
    """A oneDNN call failed: at bind time the conv falls back to im2col; at run time it is raised."""


def _api() -> dict[str, Any] | None:
    """The oneDNN functions with their signatures, a CPU engine and OpenMP's thread setters; None
    where rlx-cpu has no oneDNN (:func:`rlx_cpu.blas.library` says why)."""
    with _LOCK:
        if _STATE:
            return _STATE if _STATE.get("ok") else None
        _STATE["ok"] = False
        from . import blas

        st = blas._load()
        libs = st.get("dnnl_libs")
        if st.get("dnnl") is None or libs is None:
            return None
        lib, omp = libs
        st_t = ctypes.c_int
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "dnnl_engine_create": (st_t, [ctypes.POINTER(_VP), ctypes.c_int, ctypes.c_size_t]),
            "dnnl_stream_create": (st_t, [ctypes.POINTER(_VP), _VP, ctypes.c_uint]),
            "dnnl_memory_desc_create_with_tag": (st_t, [ctypes.POINTER(_VP), ctypes.c_int, _Dims,
                                                        ctypes.c_int, ctypes.c_int]),
            "dnnl_memory_desc_create_with_strides": (st_t, [ctypes.POINTER(_VP), ctypes.c_int, _Dims,
                                                            ctypes.c_int, _Dims]),
            "dnnl_memory_desc_query": (st_t, [_VP, ctypes.c_int, _VP]),
            "dnnl_memory_desc_destroy": (st_t, [_VP]),
            "dnnl_memory_desc_equal": (ctypes.c_int, [_VP, _VP]),
            "dnnl_memory_desc_get_size": (ctypes.c_size_t, [_VP]),
            "dnnl_convolution_forward_primitive_desc_create": (
                st_t, [ctypes.POINTER(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, _VP, _VP,
                       _Dims, _Dims, _Dims, _Dims, _VP]),
            "dnnl_matmul_primitive_desc_create": (st_t, [ctypes.POINTER(_VP), _VP, _VP, _VP, _VP, _VP, _VP]),
            "dnnl_pooling_forward_primitive_desc_create": (
                st_t, [ctypes.POINTER(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, _Dims, _Dims, _Dims,
                       _Dims, _Dims, _VP]),
            "dnnl_softmax_forward_primitive_desc_create": (
                st_t, [ctypes.POINTER(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, ctypes.c_int, _VP]),
            "dnnl_reorder_primitive_desc_create": (st_t, [ctypes.POINTER(_VP), _VP, _VP, _VP, _VP, _VP]),
            "dnnl_primitive_desc_query_md": (_VP, [_VP, ctypes.c_int, ctypes.c_int]),
            "dnnl_primitive_desc_query": (st_t, [_VP, ctypes.c_int, ctypes.c_int, _VP]),
            "dnnl_primitive_desc_destroy": (st_t, [_VP]),
            "dnnl_primitive_create": (st_t, [ctypes.POINTER(_VP), _VP]),
            "dnnl_primitive_destroy": (st_t, [_VP]),
            "dnnl_memory_create": (st_t, [ctypes.POINTER(_VP), _VP, _VP, _VP]),
            "dnnl_memory_destroy": (st_t, [_VP]),
            "dnnl_memory_set_data_handle": (st_t, [_VP, _VP]),
            "dnnl_primitive_execute": (st_t, [_VP, _VP, ctypes.c_int, ctypes.POINTER(_ExecArg)]),
            "dnnl_primitive_attr_create": (st_t, [ctypes.POINTER(_VP)]),
            "dnnl_primitive_attr_destroy": (st_t, [_VP]),
            "dnnl_primitive_attr_set_post_ops": (st_t, [_VP, _VP]),
            "dnnl_primitive_attr_set_scratchpad_mode": (st_t, [_VP, ctypes.c_int]),
            "dnnl_post_ops_create": (st_t, [ctypes.POINTER(_VP)]),
            "dnnl_post_ops_destroy": (st_t, [_VP]),
            "dnnl_post_ops_append_sum": (st_t, [_VP, ctypes.c_float, ctypes.c_int32, ctypes.c_int]),
            "dnnl_post_ops_append_eltwise": (st_t, [_VP, ctypes.c_int, ctypes.c_float, ctypes.c_float]),
        }
        fns: dict[str, Any] = {}
        try:
            for name, (res, args) in sigs.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
                fns[name] = fn
            get_t, set_t = omp.omp_get_max_threads, omp.omp_set_num_threads
        except AttributeError as e:
            _STATE["why"] = f"this libdnnl lacks {e}"
            return None
        get_t.restype, get_t.argtypes = ctypes.c_int, []
        set_t.restype, set_t.argtypes = None, [ctypes.c_int]
        engine = _VP()
        if fns["dnnl_engine_create"](ctypes.byref(engine), _CPU, 0) != 0:
            _STATE["why"] = "oneDNN could not create a CPU engine"
            return None
        # GOMP_parallel and the team queries: rlx-cpu's own kernels (rlx_cpu.stem_conv) run on this team
        try:
            gomp = tuple(int(ctypes.cast(f, _VP).value or 0) for f in (
                omp.GOMP_parallel, omp.omp_get_thread_num, omp.omp_get_num_threads))
        except AttributeError:
            gomp = None
        _STATE.update(ok=True, fns=fns, engine=engine, omp=(get_t, set_t), gomp=gomp)
        return _STATE


_TLS = threading.local()


def _stream(api: dict[str, Any]) -> Any:
    """This thread's oneDNN stream: a stream is not thread-safe, and two sessions may run one
    program's convs from two threads at once."""
    s = getattr(_TLS, "stream", None)
    if s is None:
        s = _VP()
        if api["fns"]["dnnl_stream_create"](ctypes.byref(s), api["engine"], _IN_ORDER) != 0:
            raise OneDNNError("oneDNN could not create a CPU stream", where="rlx_cpu.onednn_conv",
                              fix="set RLX_CPU_ONEDNN=0 to use the im2col path, and report it")
        _TLS.stream = s  # lives as long as the thread (a handful of bytes)
    return s


def available() -> bool:
    return _api() is not None


def _dims(vals: tuple[int, ...] | list[int]) -> Any:
    d = _Dims()
    for i, v in enumerate(vals):
        d[i] = v
    return d


class _Prim:
    """One primitive with its memory objects bound to fixed buffers; frees them when collected."""

    def __init__(self, api: dict[str, Any]) -> None:
        self.api = api
        self.fns = api["fns"]
        self.owned: list[tuple[str, Any]] = []  # (destroy function, handle), freed in reverse
        #: (memory, byte offset) in this thread's conv scratch, re-pointed when the scratch moves
        self.in_scratch: list[tuple[Any, int]] = []
        self.scratch_nb = 0

    def scratch_memory(self, md: Any) -> Any:
        mem = self.memory(md, 0)
        self.in_scratch.append((mem, self.scratch_nb))
        self.scratch_nb += -(-int(self.fns["dnnl_memory_desc_get_size"](md)) // 64) * 64
        return mem

    def attr(self) -> Any:
        """A primitive attribute with a user scratchpad: the library's own is shared by all
        primitives of a thread and binds each primitive to the thread that created it (a program
        may be compiled on one thread and run on another)."""
        attr = _VP()
        self.check(self.fns["dnnl_primitive_attr_create"](ctypes.byref(attr)), "primitive_attr_create")
        self.owned.append(("dnnl_primitive_attr_destroy", attr))
        self.check(self.fns["dnnl_primitive_attr_set_scratchpad_mode"](attr, _SCRATCHPAD_USER),
                   "set_scratchpad_mode")
        return attr

    def scratchpad(self, pd: Any) -> list[tuple[int, Any]]:
        """The scratchpad exec argument ``pd`` needs (in the conv scratch), if any."""
        md = self.fns["dnnl_primitive_desc_query_md"](pd, _QUERY_EXEC_ARG_MD, _ARG_SCRATCHPAD)
        if not md or self.fns["dnnl_memory_desc_get_size"](md) == 0:
            return []
        return [(_ARG_SCRATCHPAD, self.scratch_memory(md))]

    def own_scratchpad(self, pd: Any, keep: list[Any]) -> list[tuple[int, Any]]:
        """The scratchpad exec argument ``pd`` needs in a buffer of its own (kept in ``keep``), if
        any: for small primitives bound outside the conv scratch (linears, softmax)."""
        md = self.fns["dnnl_primitive_desc_query_md"](pd, _QUERY_EXEC_ARG_MD, _ARG_SCRATCHPAD)
        if not md or self.fns["dnnl_memory_desc_get_size"](md) == 0:
            return []
        buf = _aligned(self.fns["dnnl_memory_desc_get_size"](md))
        keep.append(buf)
        return [(_ARG_SCRATCHPAD, self.memory(md, buf.ctypes.data))]

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise OneDNNError(f"oneDNN {what} failed (status {status})", where="rlx_cpu.onednn_conv",
                              fix="set RLX_CPU_ONEDNN=0 to use the im2col path, and report it")

    def md_plain(self, arr_shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        md = _VP()
        self.check(self.fns["dnnl_memory_desc_create_with_strides"](
            ctypes.byref(md), len(arr_shape), _dims(arr_shape), _F32, _dims(strides)), "memory_desc")
        self.owned.append(("dnnl_memory_desc_destroy", md))
        return md

    def md_like(self, like: Any, shape: tuple[int, ...]) -> Any:
        """A descriptor of ``shape`` in the layout of the 4-D descriptor ``like`` (a conv's nChw16c
        output, for a pool's): the C API has no call that makes a blocked descriptor from
        strides and blocks in this version, so the format tag giving ``like`` is looked up once."""
        dims = _Dims()
        got = ctypes.POINTER(ctypes.c_int64)()
        self.check(self.fns["dnnl_memory_desc_query"](like, _QUERY_DIMS, ctypes.byref(got)),
                   "memory_desc_query")
        key = tuple(int(got[i]) for i in range(4))
        for i, v in enumerate(key):
            dims[i] = v
        tags = _STATE.setdefault("tags", [])
        for tag in [*tags, *range(2, 1024)]:
            md = _VP()
            if self.fns["dnnl_memory_desc_create_with_tag"](ctypes.byref(md), 4, dims, _F32, tag) != 0:
                continue
            same = self.fns["dnnl_memory_desc_equal"](md, like)
            self.fns["dnnl_memory_desc_destroy"](md)
            if same:
                if tag not in tags:
                    tags.append(tag)
                out = _VP()
                self.check(self.fns["dnnl_memory_desc_create_with_tag"](
                    ctypes.byref(out), 4, _dims(shape), _F32, tag), "memory_desc")
                self.owned.append(("dnnl_memory_desc_destroy", out))
                return out
        raise OneDNNError("no format tag gives this layout", where="rlx_cpu.onednn_conv",
                          fix="none needed: the conv chain runs its ops one at a time instead")

    def md_any(self, shape: tuple[int, ...]) -> Any:
        md = _VP()
        self.check(self.fns["dnnl_memory_desc_create_with_tag"](
            ctypes.byref(md), len(shape), _dims(shape), _F32, _TAG_ANY), "memory_desc")
        self.owned.append(("dnnl_memory_desc_destroy", md))
        return md

    def memory(self, md: Any, ptr: int) -> Any:
        mem = _VP()
        self.check(self.fns["dnnl_memory_create"](ctypes.byref(mem), md, self.api["engine"], _VP(ptr)),
                   "memory_create")
        self.owned.append(("dnnl_memory_destroy", mem))
        return mem

    def primitive(self, pd: Any) -> Any:
        prim = _VP()
        self.check(self.fns["dnnl_primitive_create"](ctypes.byref(prim), pd), "primitive_create")
        self.owned.append(("dnnl_primitive_destroy", prim))
        return prim

    def reorder(self, src_md: Any, dst_md: Any, src: Any, dst: Any) -> tuple[Any, list[tuple[int, Any]]]:
        """(a reorder primitive from ``src`` to ``dst`` memory, its exec arguments)."""
        pd = _VP()
        eng = self.api["engine"]
        self.check(self.fns["dnnl_reorder_primitive_desc_create"](ctypes.byref(pd), src_md, eng, dst_md,
                                                                   eng, self.attr()), "reorder")
        self.owned.append(("dnnl_primitive_desc_destroy", pd))
        return self.primitive(pd), [(_ARG_FROM, src), (_ARG_TO, dst), *self.scratchpad(pd)]

    def __del__(self) -> None:
        for name, h in reversed(self.owned):
            self.fns[name](h)
        self.owned = []


def _strides_elems(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def _aligned(nbytes: int) -> np.ndarray:
    """A float32 buffer of ``nbytes`` aligned to 64 bytes (oneDNN's kernels load whole cache lines)."""
    raw = np.empty(nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + nbytes].view(np.float32)


#: False turns this path off (tests compare it with the im2col path; users set RLX_CPU_ONEDNN=0).
USE = True
#: True: the conv's pieces run on rlx-cpu's row pool, each a one-thread primitive. False: one
#: primitive on an OpenMP team (the earlier design; kept for A/B runs, ``bench/conv_ab.py``).
ROW_POOL = True
#: Multiply-adds a piece must keep for a conv to be split over threads: a hand-off to the pool's
#: other thread costs ~20 us, a 1M-MAC conv piece ~15 us on one core (MobileNet's late depthwise
#: convs stay whole).
MIN_MACS_PER_PIECE = 1_000_000


def conv2d_onednn(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                  pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                  bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                  act: Act = "") -> Run | None:
    """A run computing ``o = conv2d(x, w) (+ bias) (+ residual)``, then the activation ``act``
    (:data:`Act`), through oneDNN (the residual and the activation as post-ops while the
    output tile is in registers), or None where
    it cannot (no oneDNN, not float32, negative or unaligned strides, a shape the primitive refuses).

    The conv is cut into pieces (images, else output rows or output channels) that run as
    one-thread primitives on rlx-cpu's row pool: no OpenMP team is ever opened, so no libgomp
    worker spins on the core the row pool needs for the next step (ResNet-18 at batch 1 lost
    ~15 ms a run to that on 2 cores), and a core taken by another process takes fewer pieces."""
    ops = tuple(a for a in (x, w, o, bias, residual) if a is not None)
    if not USE or any(a.dtype != np.float32 for a in ops) or not (x.size and o.size and w.size):
        return None
    if any(s % 4 or s < 0 for a in ops for s in a.strides) or any(a.ctypes.data % 4 for a in ops):
        return None
    api = _api()
    if api is None:
        return None

    pl = pool()
    if not ROW_POOL or settings.CONV_OPENMP.get():
        return _openmp_run(api, pl, x, w, o, strides, pads, dil, g, bias, residual, act)
    pieces = _pieces(x, w, o, strides, pads, dil, g, bias, residual, pl.threads)
    shared: dict[str, Any] = {}  # packed weights the pieces share
    try:
        runs = [_build(api, xp, wp, op, st, pd, dil, g, bp, rp, act, 1, shared)
                for xp, wp, op, st, pd, bp, rp in pieces]
    except OneDNNError:
        return None
    if len(runs) == 1:
        return runs[0]
    parts = min(pl.threads, len(runs))

    def some(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            runs[k]()

    def run() -> None:
        pl.run(some, len(runs), (), parts, len(runs))
    run.onednn_impl = runs[0].onednn_impl  # type: ignore[attr-defined]
    run.onednn_pieces = len(runs)  # type: ignore[attr-defined]
    return run


_Piece = tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int], tuple[int, int, int, int],
               "np.ndarray | None", "np.ndarray | None"]


def _pieces(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
            pads: tuple[int, int, int, int], dil: tuple[int, int], g: int, bias: np.ndarray | None,
            residual: np.ndarray | None, threads: int) -> list[_Piece]:
    """The conv as independent convs on views (x, w, o, strides, pads, bias, residual): whole
    images where the batch has one a thread at least; else output channels where the weights
    outweigh the input (ResNet's late 7x7 layers: each thread reads half the weights), else output
    rows (each piece reads its rows of the input plus the kernel's halo)."""
    whole: list[_Piece] = [(x, w, o, strides, pads, bias, residual)]
    n, oc, ho, wo = o.shape
    most = o.size * w[0].size // max(1, MIN_MACS_PER_PIECE)  # pieces the conv's work is worth
    k = min(threads, most)
    if k < 2:
        return whole
    if n >= threads:
        # Whole images, up to two pieces a thread: a thread slowed by another process takes fewer.
        k = min(n, 2 * threads, most)
        cuts = [n * i // k for i in range(k + 1)]
        return [(x[a:b], w, o[a:b], strides, pads, bias, None if residual is None else residual[a:b])
                for a, b in itertools.pairwise(cuts)]
    if g == 1 and oc % (16 * k) == 0 and w.nbytes >= x.nbytes:
        step = oc // k  # a multiple of 16: whole channel blocks of oneDNN's nChw16c layout
        return [(x, w[a:a + step], o[:, a:a + step], strides, pads,
                 None if bias is None else bias[a:a + step],
                 None if residual is None else residual[:, a:a + step]) for a in range(0, oc, step)]
    k = min(k, ho)  # a row a piece at least (many threads, small late layers)
    if k < 2:
        return whole
    (sh, _), (pt, pl, _, pr), dh = strides, pads, dil[0]
    h, kh = x.shape[2], w.shape[2]
    out: list[_Piece] = []
    cuts = [ho * i // k for i in range(k + 1)]
    for a, b in itertools.pairwise(cuts):
        lo = a * sh - pt  # the first input row piece a:b reads (negative: in the top padding)
        hi = (b - 1) * sh - pt + dh * (kh - 1) + 1  # one past the last
        if lo >= h or hi <= 0:  # a piece reading padding only: keep the conv whole
            return whole
        out.append((x[:, :, max(lo, 0):min(hi, h)], w, o[:, :, a:b], strides,
                    (max(-lo, 0), pl, max(hi - h, 0), pr), bias,
                    None if residual is None else residual[:, :, a:b]))
    return out


def _openmp_run(api: dict[str, Any], pl: RowPool, x: np.ndarray, w: np.ndarray, o: np.ndarray,
                strides: tuple[int, int], pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                bias: np.ndarray | None, residual: np.ndarray | None, act: Act) -> Run | None:
    """The whole conv as one primitive on an OpenMP team of the pool's active thread count."""
    args = (x, w, o, strides, pads, dil, g, bias, residual, act)
    try:
        teams = PerTeam(lambda n: _build(api, *args, n), pl)
    except OneDNNError:
        return None

    def run() -> None:
        teams.get()()
    run.onednn_impl = teams.full.onednn_impl  # type: ignore[attr-defined]
    return run


def _build(api: dict[str, Any], x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
           pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
           bias: np.ndarray | None, residual: np.ndarray | None, act: Act, threads: int,
           shared: dict[str, Any] | None = None) -> Run:
    """The conv as primitives created for ``threads`` OpenMP threads, and a run on that many
    (``shared``: packed constant weights that pieces of one conv reuse)."""
    get_t, set_t = api["omp"]
    prev = get_t()
    set_t(threads)
    try:
        return _build_for(api, x, w, o, strides, pads, dil, g, bias, residual, act, threads, shared)
    finally:
        set_t(prev)


def weight_dims(w: np.ndarray, g: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides in elements) of OIHW weights ``w`` as oneDNN reads them: grouped convs take
    (G, O/G, I, KH, KW) with the group stride of O/G output channels."""
    ws = _strides_elems(w)
    if g > 1:
        oc = w.shape[0]
        return (g, oc // g, *w.shape[1:]), ((oc // g) * ws[0], *ws)
    return tuple(w.shape), ws


def _build_for(api: dict[str, Any], x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
               pads: tuple[int, int, int, int], dil: tuple[int, int], g: int, bias: np.ndarray | None,
               residual: np.ndarray | None, act: Act, threads: int,
               shared: dict[str, Any] | None = None) -> Run:
    fns = api["fns"]
    p = _Prim(api)
    oc, ci, kh, kw = w.shape
    x_user = p.md_plain(x.shape, _strides_elems(x))
    o_user = p.md_plain(o.shape, _strides_elems(o))
    wshape, wstr = weight_dims(w, g)
    w_user = p.md_plain(wshape, wstr)
    b_user = None if bias is None else p.md_plain(bias.shape, _strides_elems(bias))
    pd = _VP()
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
    p.check(fns["dnnl_convolution_forward_primitive_desc_create"](
        ctypes.byref(pd), api["engine"], _FWD_INFERENCE, _CONV_DIRECT, p.md_any(x.shape),
        p.md_any(wshape), b_user, p.md_any(o.shape), _dims((sh, sw)), _dims((dh - 1, dw - 1)),
        _dims((pt, pl)), _dims((pb, pr)), _post_ops(p, residual is not None, act)),
        "convolution primitive_desc")
    p.owned.append(("dnnl_primitive_desc_destroy", pd))
    conv = p.primitive(pd)
    q = fns["dnnl_primitive_desc_query_md"]
    x_md, w_md, o_md = (q(pd, _QUERY_EXEC_ARG_MD, a) for a in (_ARG_SRC, _ARG_WEIGHTS, _ARG_DST))
    eq, size = fns["dnnl_memory_desc_equal"], fns["dnnl_memory_desc_get_size"]
    steps: list[tuple[Any, Any]] = []  # (primitive, exec args), run in order
    keep: list[Any] = [p, x, w, o]  # the pointers in the memory objects stay valid while these live

    def step(prim: Any, pairs: list[tuple[int, Any]]) -> tuple[Any, Any]:
        arr = (_ExecArg * len(pairs))(*(_ExecArg(a, m) for a, m in pairs))
        keep.append(arr)
        return prim, arr

    # Blocked copies of the input and output and the primitives' scratchpads live in this
    # thread's conv scratch (rlx_cpu.conv: the convs of a program run one after another; a
    # buffer per conv would hold 160 MB more for ResNet-18 at batch 8).
    # Input: read in place if the primitive takes plain NCHW, else reordered into a blocked copy.
    if eq(x_md, x_user):
        x_mem = p.memory(x_user, x.ctypes.data)
    else:
        x_mem = p.scratch_memory(x_md)
        steps.append(step(*p.reorder(x_user, x_md, p.memory(x_user, x.ctypes.data), x_mem)))
    # Weights: packed once now when they are constants (read-only: the program's own copy).
    w_src = p.memory(w_user, w.ctypes.data)
    pack = None
    prev_w = None if shared is None or w.flags.writeable else shared.get("w")
    if eq(w_md, w_user):
        w_mem = w_src
    elif prev_w is not None and prev_w[0] is w and eq(w_md, prev_w[1]):
        w_mem = prev_w[2]  # another piece of this conv packed the same weights the same way
        keep.append(prev_w[3])
    else:
        wb = _aligned(size(w_md))
        keep.append(wb)
        w_mem = p.memory(w_md, wb.ctypes.data)
        pack = step(*p.reorder(w_user, w_md, w_src, w_mem))
        if w.flags.writeable:
            steps.append(pack)
        elif shared is not None:  # the next piece's primitive may read them as they are
            shared["w"] = (w, w_md, w_mem, (p, wb))
    o_mem = p.memory(o_user, o.ctypes.data) if eq(o_md, o_user) else p.scratch_memory(o_md)
    if residual is not None:  # the sum post-op adds what the destination holds: the residual
        r_user = p.md_plain(residual.shape, _strides_elems(residual))
        steps.append(step(*p.reorder(r_user, o_md, p.memory(r_user, residual.ctypes.data), o_mem)))
        keep.append(residual)
    conv_args = [(_ARG_SRC, x_mem), (_ARG_WEIGHTS, w_mem), (_ARG_DST, o_mem), *p.scratchpad(pd)]
    if bias is not None and b_user is not None:
        conv_args.append((_ARG_BIAS, p.memory(b_user, bias.ctypes.data)))
    steps.append(step(conv, conv_args))
    if not eq(o_md, o_user):
        steps.append(step(*p.reorder(o_md, o_user, o_mem, p.memory(o_user, o.ctypes.data))))
    from .conv import scratch

    set_handle = fns["dnnl_memory_set_data_handle"]
    where = [-1]  # the scratch address the memories point into now

    def bind_scratch() -> None:
        if p.in_scratch:
            base = -(-scratch(p.scratch_nb + 64).ctypes.data // 64) * 64
            if base != where[0]:
                for mem, off in p.in_scratch:
                    p.check(set_handle(mem, _VP(base + off)), "memory_set_data_handle")
                where[0] = base

    if pack is not None and not w.flags.writeable:
        bind_scratch()
        _execute(api, [pack], 1)
        # The packed copy is what runs: a memory-mapped original's pages leave the RSS (a fallback
        # that reads it again maps them again).
        release_file_pages(w)

    execute = executor(api, steps, threads, keep)

    def run() -> None:
        bind_scratch()
        execute()
    run.onednn_impl = impl_info(api, pd)  # type: ignore[attr-defined]  # for profiles and tests
    return run


def _post_ops(p: _Prim, add: bool, act: Act, clip: tuple[float, float] | None = None) -> Any:
    """The conv's attribute: a user scratchpad, and the sum (residual), activation and clip
    post-ops (``clip``: oneDNN's, which turns NaN into the lower bound: for inputs that cannot
    hold one, see ``rlx_cpu.conv_chain.FUSE_CLIPS``)."""
    fns = p.fns
    attr = p.attr()
    name, alpha, beta = (act, 0.0, 0.0) if isinstance(act, str) else act
    if not (add or name or clip):
        return attr
    ops = _VP()
    p.check(fns["dnnl_post_ops_create"](ctypes.byref(ops)), "post_ops_create")
    p.owned.append(("dnnl_post_ops_destroy", ops))
    if add:
        p.check(fns["dnnl_post_ops_append_sum"](ops, 1.0, 0, _DT_UNDEF), "post_ops_append_sum")
    if name == "relu":
        # ReLU that keeps NaN (as the core's relu): oneDNN's own relu is vmaxps(x, 0), which turns
        # NaN into 0. elu with alpha 0 is x where x > 0, else 0 * (exp(x) - 1): NaN stays NaN and
        # negatives become -0, which the linear 1 * y + 0 makes +0.
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_ELU, 0.0, 0.0), "append_eltwise")
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_LINEAR, 1.0, 0.0), "append_eltwise")
    elif name == "relu_drops_nan":  # max(y, 0): one instruction, NaN becomes 0
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_RELU, 0.0, 0.0), "append_eltwise")
    elif name == "silu":  # swish with alpha 1: x * sigmoid(x)
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_SWISH, 1.0, 0.0), "append_eltwise")
    elif name == "hardswish":  # x * min(max(alpha * x + beta, 0), 1); NaN stays NaN (tested)
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_HARDSWISH, alpha, beta), "append_eltwise")
    elif name:
        raise OneDNNError(f"no oneDNN post-op for activation {act!r}", where="rlx_cpu.onednn_conv",
                          fix="use one of rlx_cpu.onednn_conv.Act")
    if clip is not None:
        p.check(fns["dnnl_post_ops_append_eltwise"](ops, _ELTWISE_CLIP, clip[0], clip[1]), "append_eltwise")
    p.check(fns["dnnl_primitive_attr_set_post_ops"](attr, ops), "primitive_attr_set_post_ops")
    return attr


def impl_info(api: dict[str, Any], pd: Any) -> str:
    out = ctypes.c_char_p()
    if api["fns"]["dnnl_primitive_desc_query"](pd, _QUERY_IMPL_INFO, 0, ctypes.byref(out)) != 0:
        return "?"
    return (out.value or b"?").decode()


Steps = tuple[list[tuple[Any, Any]], list[Any], Any]


def made_for(api: dict[str, Any], threads: int, make: Callable[[], Steps]) -> Run:
    """The primitives ``make()`` binds (``(execute steps, what they point into, implementation
    names)``), made while OpenMP is set to ``threads`` (oneDNN fixes a primitive's work split when
    it is made) and run on that many: an :func:`executor` carrying ``onednn_impl``."""
    get_t, set_t = api["omp"]
    prev = get_t()
    set_t(threads)
    try:
        steps, keep, impl = make()
    finally:
        set_t(prev)
    run = executor(api, steps, threads, keep)
    run.onednn_impl = impl  # type: ignore[attr-defined]
    return run


def executor(api: dict[str, Any], steps: list[tuple[Any, Any]], threads: int, keep: Any = None) -> Run:
    """A run of ``steps`` on ``threads`` OpenMP threads with its lookups made once: what a bound
    primitive calls every run (:func:`_execute` for one-off runs; ~0.3 us a call less, a tenth of
    a small linear's)."""
    bound = [(prim, len(args), args) for prim, args in steps]
    run = _grouped(api, [(threads, bound)], keep)  # keep: the arrays the memory objects point into
    run.steps = bound  # type: ignore[attr-defined]  # what sequence() runs of it
    run.threads = threads  # type: ignore[attr-defined]
    return run


def sequence(api: dict[str, Any], runs: list[Run]) -> Run:
    """:func:`executor` runs in order as one call: one thread-count save and restore, one stream
    lookup and no closure per primitive (the MLP 784-512-256-10's three linears and softmax at
    batch 1: see ``rlx_cpu.dense``). Each keeps the thread count its primitives were made for."""
    return _grouped(api, *_groups(runs))


def sequence_plan(api: dict[str, Any], runs: list[Run], io: tuple[np.ndarray, np.ndarray],
                  nan_scan: bool) -> Any | None:
    """:func:`sequence`'s primitives as a plan for ``_dispatch.run_io`` that also copies the
    program's input in and its output out (``io``; ``nan_scan``: and reports a NaN in it), or None
    without the extension."""
    return native_plan(api, *_groups(runs), io=io, nan_scan=io[1].itemsize if nan_scan else 0)


def _groups(runs: list[Run]) -> tuple[list[tuple[int, list[tuple[Any, int, Any]]]], list[Any]]:
    return ([(r.threads, r.steps) for r in runs],  # type: ignore[attr-defined]
            [r.keep for r in runs])  # type: ignore[attr-defined]


def _grouped(api: dict[str, Any], groups: list[tuple[int, list[tuple[Any, int, Any]]]], keep: Any) -> Run:
    """A run of each group's bound primitives on its thread count, the caller's count restored:
    one call of the compiled loop (:func:`native_plan`) where there is one, else a Python loop."""
    plan = native_plan(api, groups, keep)
    if plan is not None:
        from ._dispatch import run as run_plan

        def native() -> None:
            st = run_plan(plan, _stream_address(api))
            if st != 0:
                _failed(st)
        native.keep = keep  # type: ignore[attr-defined]
        return native
    ex = api["fns"]["dnnl_primitive_execute"]
    get_t, set_t = api["omp"]

    def run() -> None:
        prev = cur = get_t()
        try:
            stream = _stream(api)
            for threads, bound in groups:
                if threads != cur:
                    set_t(threads)
                    cur = threads
                for prim, n, args in bound:
                    st = ex(prim, stream, n, args)
                    if st != 0:
                        _failed(st)
            # No dnnl_stream_wait: with the OpenMP runtime (the only one rlx-cpu loads: libgomp)
            # a CPU primitive has finished when execute returns, and oneDNN's CPU stream wait
            # returns at once (cpu_stream.hpp: it waits only with the threadpool runtime).
        finally:
            if cur != prev:
                set_t(prev)
    run.keep = keep  # type: ignore[attr-defined]
    return run


def native_plan(api: dict[str, Any], groups: list[tuple[int, list[tuple[Any, int, Any]]]], keep: Any,
                io: tuple[np.ndarray, np.ndarray] | None = None, nan_scan: int = 0) -> Any | None:
    """``groups`` as a :class:`rlx_cpu._dispatch.Plan` (one C call runs them all, with the same
    thread-count handling as the Python loop), or None without the extension. ``io``: the
    program's input and output buffers (C-contiguous), for ``_dispatch.run_io``; ``nan_scan``
    (the output's itemsize, 4 or 8): run_io returns -1 when the output holds a NaN. The plan holds
    ``groups``, ``keep`` and ``io``: every primitive, argument array and buffer it points into."""
    if native.why_not() is not None:
        return None
    from ._dispatch import Plan

    get_t, set_t = api["omp"]
    words = [_address(api["fns"]["dnnl_primitive_execute"]), _address(get_t), _address(set_t)]
    if io is None:
        words += [0, 0, 0, 0, 0]
    else:
        into, frm = io
        assert into.flags.c_contiguous and frm.flags.c_contiguous
        words += [into.ctypes.data, into.nbytes, frm.ctypes.data, frm.nbytes, nan_scan]
    for threads, bound in groups:
        for prim, n, args in bound:
            words += [threads, prim.value, n, ctypes.addressof(args)]
    return Plan(np.array(words, np.int64), (groups, keep, io))


def _address(fn: Any) -> int:
    return int(ctypes.cast(fn, _VP).value or 0)


def _stream_address(api: dict[str, Any]) -> int:
    """This thread's stream (:func:`_stream`) as an address."""
    a = getattr(_TLS, "address", None)
    if a is None:
        a = _TLS.address = _stream(api).value
    return a


def _failed(status: int) -> None:
    raise OneDNNError(f"oneDNN failed at run time (status {status})", where="rlx_cpu.onednn_conv",
                      fix="set RLX_CPU_ONEDNN=0 to use the im2col path, and report it")


def _execute(api: dict[str, Any], steps: list[tuple[Any, Any]], threads: int, keep: Any = None) -> None:
    """Run ``steps`` on ``threads`` OpenMP threads (``keep``: the arrays the memory objects point
    into, referenced here so that the run closure holds them). Its own loop, not an executor: conv
    pieces call it at every run, where making a closure a call would cost more."""
    fns = api["fns"]
    get_t, set_t = api["omp"]
    prev = get_t()
    if prev != threads:
        set_t(threads)
    try:
        ex, stream = fns["dnnl_primitive_execute"], _stream(api)
        for prim, args in steps:
            st = ex(prim, stream, len(args), args)
            if st != 0:
                _failed(st)
    finally:
        if prev != threads:
            set_t(prev)
