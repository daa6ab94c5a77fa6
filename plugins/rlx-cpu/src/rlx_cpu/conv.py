"""Float conv2d for rlx-cpu: oneDNN's convolution primitive for float32 where the optional oneDNN
wheel is installed (:mod:`rlx_cpu.onednn_conv`), else im2col plus one GEMM per group.

A batch of at least as many images as threads gives each thread whole images: its own im2col
scratch and single-threaded GEMMs on rlx-cpu's BLAS (:mod:`rlx_cpu.blas`: oneDNN for float32), no
synchronisation until the end. Fewer images run one after another with NumPy's threaded BLAS
(splitting each GEMM by output channels over the pool was tried and was not faster at batch 1:
the im2col stays serial and every GEMM pays a hand-off). Compare with
``RLX_CPU_PRIVATE_BLAS=0 rlx bench infer resnet18 --batch 8``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

Run = Callable[[], None]

if TYPE_CHECKING:
    from .onednn_conv import Act


_TLS = threading.local()


def scratch(nbytes: int) -> np.ndarray:
    """This thread's scratch bytes, grown on demand and shared by every conv that runs on it: the
    convs of a program run one after another, so one im2col buffer serves them all (a buffer per
    conv cost 1.1 GB of RSS for ResNet-18 at batch 8)."""
    buf = getattr(_TLS, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1), np.uint8)
        _TLS.buf = buf
    return buf


def _align(n: int) -> int:
    return -(-n // 64) * 64


def conv2d_float(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                 pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                 bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                 act: Act = "") -> Run:
    """``o = conv2d(x, w) (+ bias per output channel) (+ residual)``, then the activation ``act``
    (:data:`rlx_cpu.onednn_conv.Act`):
    float32 on oneDNN's convolution primitive where rlx-cpu has oneDNN (:mod:`rlx_cpu.onednn_conv`),
    else :func:`conv2d_im2col` and the rest in place afterwards."""
    crop = crop_dead_taps(x.shape, w, o.shape, strides, pads, dil)
    if crop is not None:
        w, pads = crop
    small = _small_conv(x, w, o, strides, pads, dil, g, bias, residual, act)
    if small is not None:  # it pads with zeros as the definition does: NaN weights need no check
        return small
    # oneDNN skips the zero padding, so a NaN/inf weight that the padding multiplies gives a finite
    # edge where zero-padding-then-convolve (the definition, and the reference) gives NaN: such
    # weights take the im2col path. Constants (read-only) are checked once, run-time weights per run.
    fast = None
    padded = any(pads)
    if x.dtype == np.float32 and not (padded and not w.flags.writeable and not np.isfinite(w).all()):
        from .onednn_conv import conv2d_onednn

        fast = conv2d_onednn(x, w, o, strides, pads, dil, g, bias, residual, act)
        if fast is not None and not (padded and w.flags.writeable):
            return fast
    slow = _conv2d_im2col_post(x, w, o, strides, pads, dil, g, bias, residual, act)
    if fast is None:
        return slow
    checked_fast, checked_slow = fast, slow

    def run_checked() -> None:
        (checked_fast if np.isfinite(w).all() else checked_slow)()
    return run_checked


def _live_taps(n_in: int, n_out: int, s: int, p: int, d: int, k: int) -> list[int]:
    """The kernel taps along one axis that read an input element for some output position."""
    return [t for t in range(k) if any(0 <= i * s - p + t * d < n_in for i in range(n_out))]


def crop_dead_taps(x_shape: tuple[int, ...], w: np.ndarray, o_shape: tuple[int, ...],
                   strides: tuple[int, int], pads: tuple[int, int, int, int], dil: tuple[int, int]
                   ) -> tuple[np.ndarray, tuple[int, int, int, int]] | None:
    """(the constant weights cropped to their live taps, the pads that keep every output where it
    was), or None where every tap is live. A dilated conv on a small input reads only padding with
    its outer taps: DeepLabV3's ASPP 3x3 convs (dilation 12/24/36) on a 4x4 feature map are 1x1
    convs of their centre taps: 85-87 -> 54-61 us each at batch 1 on oneDNN, which computes the zeros
    (``bench/profile_cpu.py --zoo deeplabv3_mobilenet_v3 --batch 1 --chain``, old and new code).
    Only for constant weights (read-only), and only where the dropped taps are finite: the
    definition multiplies them by the zero padding, so a NaN there makes the output NaN."""
    kh, kw = w.shape[2], w.shape[3]
    if w.flags.writeable or (kh == 1 and kw == 1):
        return None
    (sh, sw), (pt, pl, _pb, _pr), (dh, dw) = strides, pads, dil
    rows = _live_taps(x_shape[2], o_shape[2], sh, pt, dh, kh)
    cols = _live_taps(x_shape[3], o_shape[3], sw, pl, dw, kw)
    if not rows or not cols or (len(rows) == kh and len(cols) == kw):
        return None  # nothing live (the output is the bias alone: left to the general path) or all
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    new_pt, new_pl = pt - r0 * dh, pl - c0 * dw
    # The fewest end pads that still give every output (a stride may leave input rows unread:
    # then a negative count is rounded up to 0 and the output size checked).
    new_pb = max(0, (o_shape[2] - 1) * sh + dh * (r1 - r0 - 1) + 1 - x_shape[2] - new_pt)
    new_pr = max(0, (o_shape[3] - 1) * sw + dw * (c1 - c0 - 1) + 1 - x_shape[3] - new_pl)
    if (min(new_pt, new_pl) < 0
            or (x_shape[2] + new_pt + new_pb - dh * (r1 - r0 - 1) - 1) // sh + 1 != o_shape[2]
            or (x_shape[3] + new_pl + new_pr - dw * (c1 - c0 - 1) - 1) // sw + 1 != o_shape[3]):
        return None
    keep = np.zeros((kh, kw), bool)
    keep[r0:r1, c0:c1] = True
    if not np.isfinite(w[:, :, ~keep]).all():
        return None
    cropped = np.ascontiguousarray(w[:, :, r0:r1, c0:c1])
    cropped.flags.writeable = False  # still a constant of the program
    return cropped, (new_pt, new_pl, new_pb, new_pr)


#: Multiply-adds (all images) up to which a float32 conv with at least ``SMALL_MIN_GROUP_OUT`` output
#: channels a group is one :func:`rlx_cpu._small_conv_nb.conv_small` call (0: never). Measured on
#: the 2-core CI machine (``python bench/small_conv.py``): a ViT patch embedding (98K) 8.3 -> 3.9 us,
#: Whisper's conv1d stem (49K each) 6.9 -> 3.4 us, a 32->32 grouped conv1d (19K) 7.4 -> 4.7 us; with
#: the path forced on, a 3->16 4x4/4 stem (197K) was 11 -> 13 us, a ViT patch embedding of 8 images
#: (786K) 17 -> 23 us, so they stay on oneDNN, as do depthwise convs (a GEMM of one row per group:
#: 70-80 us).
SMALL_MACS = 150_000
SMALL_MIN_GROUP_OUT = 8


def _small_conv(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                bias: np.ndarray | None, residual: np.ndarray | None, act: Act) -> Run | None:
    """The whole conv as one call (:mod:`rlx_cpu._small_conv_nb`) where it is tiny, else None."""
    name = act if isinstance(act, str) else act[0]
    n, c, h, wd = x.shape
    oc, ci, kh, kw = w.shape
    _, _, ho, wo = o.shape
    f32 = np.dtype(np.float32)
    contiguous = x.flags.c_contiguous and o.flags.c_contiguous and w.flags.c_contiguous
    if (name not in ("", "relu") or not (x.dtype == w.dtype == o.dtype == f32) or not contiguous
            or oc // g < SMALL_MIN_GROUP_OUT or o.size * ci * kh * kw > SMALL_MACS
            or (bias is not None and (bias.dtype != f32 or bias.shape != (oc,)))
            or (residual is not None and (residual.dtype != f32 or residual.shape != o.shape
                                          or not residual.flags.c_contiguous))
            or any(a is not None and np.shares_memory(a, o) for a in (x, w, bias, residual))):
        return None  # (the GEMM writes o before the tail reads the residual)
    from . import blas

    if not blas.onednn(f32):
        return None
    from ._small_conv_nb import conv_small

    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
    hp, wp = h + pt + pb, wd + pl + pr
    ch, i, j = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    koff = (ch * hp * wp + i * dh * wp + j * dw).reshape(-1).astype(np.int64)
    oh, ow = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    poff = (oh * sh * wp + ow * sw).reshape(-1).astype(np.int64)
    xp = np.zeros(c * hp * wp if any(pads) else 0, np.float32)  # this conv's own: its border stays 0
    cols = np.empty(c * kh * kw * ho * wo, np.float32)
    args = (blas.dnnl_fns(), x, xp, np.array(pads, np.int64), koff, poff, w.reshape(oc, ci * kh * kw),
            np.zeros(oc, np.float32) if bias is None else bias,
            np.empty((0, 0, 0, 0), np.float32) if residual is None else residual, o, cols, g, name == "relu")

    def run() -> None:
        conv_small(*args)
    return run


def silu_inplace(o: np.ndarray) -> None:
    """``o *= sigmoid(o)``, sigmoid as the core's reference computes it (exp overflows to inf for
    large negatives, giving -0)."""
    with np.errstate(over="ignore"):
        s = np.exp(-o)
    s += 1
    np.divide(o, s, out=o)


def _conv2d_im2col_post(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                        pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                        bias: np.ndarray | None, residual: np.ndarray | None, act: Act) -> Run:
    run = conv2d_im2col(x, w, o, strides, pads, dil, g)
    name, alpha, beta = (act, 0.0, 0.0) if isinstance(act, str) else act
    if bias is None and residual is None and not name:
        return run
    b = None if bias is None else bias.reshape(1, -1, 1, 1)

    def run_post() -> None:
        run()
        if b is not None:
            np.add(o, b, out=o)
        if residual is not None:
            np.add(o, residual, out=o)
        if name == "relu":
            np.maximum(o, 0, out=o)
        elif name == "silu":
            silu_inplace(o)
        elif name == "hardswish":
            t = o * o.dtype.type(alpha)
            t += o.dtype.type(beta)
            np.maximum(t, 0, out=t)
            np.minimum(t, 1, out=t)
            np.multiply(o, t, out=o)
    return run_post


def conv2d_im2col(x: np.ndarray, w: np.ndarray, o: np.ndarray, strides: tuple[int, int],
                  pads: tuple[int, int, int, int], dil: tuple[int, int], g: int) -> Run:
    """Per image: im2col in (C*KH*KW, HO*WO) order, then one GEMM per group ``W @ cols`` written
    straight into that image's NCHW output (no transpose afterwards).

    The gather copies whole output rows (contiguous along WO); a 1x1, stride-1, unpadded conv
    needs no im2col at all. The im2col (and padding) buffer is per-thread scratch sized for one
    image, so memory does not grow with the batch.
    """
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
    n, c, h, wd = x.shape
    oc, ci, kh, kw = w.shape
    _, _, ho, wo = o.shape
    og, kk, p = oc // g, ci * kh * kw, ho * wo
    wmat = np.ascontiguousarray(w.reshape(g, og, kk))
    outs = [o[i].reshape(g, og, p) for i in range(n)]
    pooled = _pooled(x.dtype, n, n * oc * kk * p)
    if kh == kw == 1 and sh == sw == 1 and not any(pads):
        ins = [x[i].reshape(g, ci, h * wd) for i in range(n)]

        def run_1x1() -> None:
            for xi, oi in zip(ins, outs):
                np.matmul(wmat, xi, out=oi)
        if pooled:
            return _pool_images(n, og, lambda i, _buf: ins[i], wmat, outs, 0)
        return run_1x1
    dt = x.dtype
    hp, wp = h + pt + pb, wd + pl + pr
    cols_nb = _align(g * kk * p * dt.itemsize)
    pad_nb = _align(c * hp * wp * dt.itemsize) if any(pads) else 0
    kwin = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    per_thread: dict[int, dict[str, Any]] = {}  # views into each thread's scratch, made once

    def window(img: np.ndarray) -> np.ndarray:
        win = np.lib.stride_tricks.sliding_window_view(img, kwin, axis=(1, 2))
        return win[:, ::sh, ::sw, ::dh, ::dw][:, :ho, :wo].transpose(0, 3, 4, 1, 2)  # c,kh,kw,ho,wo

    def views_of(buf: np.ndarray) -> dict[str, Any]:
        tid = threading.get_ident()
        v = per_thread.get(tid)
        if v is not None and v["buf"] is buf:
            return v
        cols = buf[:g * kk * p * dt.itemsize].view(dt).reshape(g, kk, p)
        v = {"buf": buf, "cols": cols, "dst": cols.reshape(c, kh, kw, ho, wo)}
        if pad_nb:
            padded = buf[cols_nb:cols_nb + c * hp * wp * dt.itemsize].view(dt).reshape(c, hp, wp)
            v.update(padded=padded, inner=padded[:, pt:pt + h, pl:pl + wd], src=window(padded))
        else:
            v.update(srcs=[window(x[i]) for i in range(n)])
        per_thread[tid] = v  # replaces the views of a scratch this thread has outgrown
        return v

    def im2col(i: int, buf: np.ndarray) -> np.ndarray:
        v = views_of(buf)
        if pad_nb:
            v["padded"].fill(0)  # the shared scratch holds another conv's bytes
            np.copyto(v["inner"], x[i])
            np.copyto(v["dst"], v["src"])
        else:
            np.copyto(v["dst"], v["srcs"][i])
        cols: np.ndarray = v["cols"]
        return cols

    if pooled:
        return _pool_images(n, og, im2col, wmat, outs, cols_nb + pad_nb)

    def run() -> None:
        buf = scratch(cols_nb + pad_nb)
        for i in range(n):
            np.matmul(wmat, im2col(i, buf), out=outs[i])
    return run


#: Multiply-adds from which a conv runs on rlx-cpu's own BLAS over the row pool.
POOL_MIN_MACS = 2_000_000


def _pooled(dt: np.dtype, images: int, macs: int) -> bool:
    from . import blas
    from .parallel import pool

    threads = pool().threads
    return (1 < threads <= images and macs >= POOL_MIN_MACS and dt in (np.float32, np.float64)
            and blas.available())


def _gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, lo: int, hi: int) -> None:
    """Rows ``lo:hi`` of ``c = a @ b`` on this thread (rlx-cpu's BLAS; NumPy if it cannot)."""
    from . import blas

    run = blas.gemm_fn(a, b, c)
    if run is None:
        np.matmul(a[lo:hi], b, out=c[lo:hi])
    else:
        run(lo, hi)


def _pool_images(n: int, og: int, cols_of: Callable[[int, np.ndarray], np.ndarray], wmat: np.ndarray,
                 outs: list[np.ndarray], scratch_nb: int) -> Run:
    """Whole images a thread, each with this thread's scratch and single-threaded GEMMs."""
    from .parallel import pool

    pl = pool()
    g = wmat.shape[0]

    def images(lo: int, hi: int) -> None:
        buf = scratch(scratch_nb)
        for i in range(lo, hi):
            cols = cols_of(i, buf)
            for k in range(g):
                _gemm(wmat[k], cols[k], outs[i][k], 0, og)
    return lambda: pl.run(images, n, (), pl.threads)


def k_conv2d_bias(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                  residual: np.ndarray | None = None, act: Act = "") -> Run:
    """HIR ``conv2d_bias`` (f32/f64) natively, and with ``residual``/``relu`` the fused tails of
    :mod:`rlx_cpu.conv_fusion`: oneDNN applies them while the output tile is in registers; the
    im2col path applies them in place afterwards."""
    x, w, b = ins[:3]
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = attrs["pads"]
    dh, dw = attrs["dilations"]
    return conv2d_float(x, w, outs[0], (int(sh), int(sw)), (int(pt), int(pl), int(pb), int(pr)),
                        (int(dh), int(dw)), int(attrs["groups"]), b, residual, act)
