"""ONNX operators that need exact primitives or long decompositions (issue 17): float ``Mod`` and
``BitCast`` (onto the exact ops of :mod:`rlx_core.ir.ops.exact`), ``LpPool`` (any rank, dilations,
auto_pad, ceil_mode), ``MaxUnpool``, ``Det`` (from ``lu``), ``AffineGrid``, ``RoiAlign``,
``DeformConv`` (2-D) and 3-D ``ConvTranspose``, decomposed into existing RLX IR ops.

The handlers register in :mod:`rlx_core.frontends.onnx`'s table (that module imports this one after
:mod:`~rlx_core.frontends.onnx_index` and :mod:`~rlx_core.frontends.onnx_nn`, whose integer ``Mod``
and 1-D/2-D ``ConvTranspose`` this module's handlers extend), so the ONNX importer stays one entry
point. Zero wrong numbers: a case that cannot be translated exactly, or on which onnx's reference
and ONNX Runtime disagree (MaxUnpool with another output_shape), is refused with an
:class:`~rlx_core.frontends.onnx.UnsupportedOnnxError` naming the node, operator, attribute and the
fix. ``ImageDecoder`` stays untranslated: decoding needs an image codec, which no backend has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from ..ir.ops.exact import BITCAST_DTYPES
from . import onnx as _onnx
from .onnx import _handler, _Importer, _onnx_type_name
from .onnx_index import _mod as _mod_int

_ONNX_TO_DTYPE: dict[int, DType] = _onnx._ONNX_TO_DTYPE
# Mod-28 allows fmod=0 on floats (the handler implements both modes); BitCast appeared in opset 26.
_onnx._OP_REVIEWED.update({"BitCast": 26})


@_handler("Mod")
def _mod(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Floats: the exact ``mod`` op (``fmod=1``: C's ``fmod``, sign of the dividend; ``fmod=0``:
    Python's ``%``, sign of the divisor, as onnx's reference and ONNX Runtime compute it).
    Integers: :func:`rlx_core.frontends.onnx_index._mod`'s decomposition."""
    a, b = imp.pair(ins[0], ins[1])
    if not a.dtype.is_float:
        return list(_mod_int(imp, node, [a, b], attrs))
    fmod = int(attrs.get("fmod", 0))
    if fmod not in (0, 1):
        raise imp.unsupported(f"Mod fmod={fmod}", fix="fmod is 0 (Python's %) or 1 (C's fmod)")
    return [imp.g.op("mod", a, b, mode="fmod" if fmod else "floor")]


@_handler("BitCast")
def _bitcast(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Each element's bits reinterpreted as ``to`` (same width), NumPy's ``.view``."""
    code = int(attrs.get("to", 0))
    to = _ONNX_TO_DTYPE.get(code)
    x = imp.t(ins[0])
    if to is None:
        raise imp.unsupported(f"BitCast to ONNX type {_onnx_type_name(code)} is not supported",
                              fix=f"RLX dtypes: {', '.join(d.value for d in DType)}")
    if to.itemsize != x.dtype.itemsize:
        raise imp.unsupported(f"BitCast from {x.dtype} to {to} changes the element width "
                              f"({x.dtype.itemsize} -> {to.itemsize} bytes)",
                              fix="the model is malformed: BitCast needs types of one width")
    if to == DType.BOOL:
        raise imp.unsupported("BitCast to bool is not supported: a byte other than 0 or 1 is no bool",
                              fix="BitCast to uint8, then compare with 0 (Cast to bool)")
    if to == x.dtype:
        return [x]
    for dt in (x.dtype, to):
        if dt not in BITCAST_DTYPES:
            raise imp.unsupported(f"BitCast of {dt.value} is not supported",
                                  fix=f"BitCast works on {', '.join(d.value for d in BITCAST_DTYPES)}")
    return [imp.g.op("bitcast", x, to=to, src=x.dtype)]


# ---------------------------------------------------------------------------------------------
# Pooling

#: Most kernel positions a pooling written out as shifted slices may have (each is a graph node).
_WINDOW_MAX = 512


def _window_sum(imp: _Importer, x: Tensor, kernel: Sequence[int], strides: Sequence[int],
                dil: Sequence[int], pads: Sequence[int], ceil_ext: Sequence[int]) -> Tensor:
    """Sum over each pooling window of ``x`` (N, C, spatial...), zero padding (explicit pads, then
    ceil_mode's extension at the ends): one strided slice of the padded input per kernel position."""
    g = imp.g
    nd = len(kernel)
    sizes = [int(n) for n in x.shape[2:]]
    end = [p + e for p, e in zip(pads[nd:], ceil_ext)]
    full = (0, 0, *pads[:nd], 0, 0, *end)
    xp = g.op("pad", x, pads=full, value=0.0) if any(full) else x
    padded = [n + pads[i] + end[i] for i, n in enumerate(sizes)]
    outs = [(padded[i] - ((kernel[i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(nd)]
    axes = tuple(range(2, 2 + nd))
    acc: Tensor | None = None
    for pos in np.ndindex(*kernel):
        starts = tuple(j * d for j, d in zip(pos, dil))
        stops = tuple(st + (o - 1) * s + 1 for st, o, s in zip(starts, outs, strides))
        t = g.op("slice", xp, starts=starts, stops=stops, axes=axes, steps=tuple(strides))
        acc = t if acc is None else acc + t
    assert acc is not None
    return acc


def _ceil_ext(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dil: Sequence[int],
              pads: Sequence[int]) -> list[int]:
    """ceil_mode's extra end padding per spatial axis (onnx's reference pool output size: the last
    window must start inside the input or its begin padding)."""
    nd = len(kernel)
    ext = [0] * nd
    for i in range(nd):
        span_k = (kernel[i] - 1) * dil[i] + 1
        span = sizes[i] + pads[i] + pads[i + nd] - span_k
        out = -(-span // strides[i]) + 1
        if (out - 1) * strides[i] >= sizes[i] + pads[i]:
            out -= 1
        ext[i] = max(0, (out - 1) * strides[i] + span_k - (sizes[i] + pads[i] + pads[i + nd]))
    return ext


@_handler("LpPool")
def _lp_pool(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``(sum over the window of |x|^p) ^ (1/p)``; padding (explicit, auto_pad, ceil_mode's
    extension) contributes zeros, as ONNX Runtime computes it. Any rank and dilation. (onnx's
    reference computes an average times the kernel size, which scales up a window that ceil_mode
    extends past the input: a bug of the reference, not the operator's definition.)"""
    g = imp.g
    x = imp.t(ins[0])
    nd = x.rank - 2
    if nd < 1:
        raise imp.unsupported(f"LpPool of a rank-{x.rank} input {x.shape}",
                              fix="pooling takes (N, C, spatial...) inputs")
    if not x.dtype.is_float or x.dtype == DType.C64:
        raise imp.unsupported(f"LpPool of {x.dtype.value}", fix="LpPool takes float inputs")
    if not all(isinstance(n, int) for n in x.shape[2:]):
        raise imp.symbolic(f"LpPool needs static spatial dims (input {x.shape})")
    kernel = [int(k) for k in attrs["kernel_shape"]]
    n_pos = math.prod(kernel)
    if n_pos > _WINDOW_MAX:
        raise imp.unsupported(f"LpPool kernel_shape={kernel} ({n_pos} positions) written out as slices "
                              f"would be too large a graph", fix=f"use a kernel of at most {_WINDOW_MAX} "
                              "positions")
    strides, dil, pads = _onnx._spatial(imp, attrs, x.shape[2:], kernel, nd, "LpPool")
    sizes = [int(n) for n in x.shape[2:]]
    ext = _ceil_ext(sizes, kernel, strides, dil, pads) if int(attrs.get("ceil_mode", 0)) else [0] * nd
    p = float(attrs.get("p", 2))
    if not p > 0 or not math.isfinite(p):
        raise imp.unsupported(f"LpPool p={p}", fix="p must be a positive finite number")
    a = g.op("abs", x)
    if p == 1:
        return [_window_sum(imp, a, kernel, strides, dil, pads, ext)]
    if p == 2:
        return [g.op("sqrt", _window_sum(imp, a * a, kernel, strides, dil, pads, ext))]
    s = _window_sum(imp, g.op("pow", a, g.const(p, x.dtype)), kernel, strides, dil, pads, ext)
    return [g.op("pow", s, g.const(1.0 / p, x.dtype))]


@_handler("MaxUnpool")
def _max_unpool(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Zeros of the unpooled shape with ``y.flat[I] = X`` (the last of duplicate indices wins, as
    in onnx's reference and ONNX Runtime: equal values, both the maximum of overlapping windows).
    An ``output_shape`` other than the inferred one is refused: onnx's reference scatters into the
    inferred shape and pads at the ends, ONNX Runtime indexes the larger shape, so they disagree."""
    g = imp.g
    x = imp.t(ins[0])
    idx = imp.t(ins[1])
    nd = x.rank - 2
    if nd < 1 or idx.shape != x.shape:
        raise imp.unsupported(f"MaxUnpool of X {x.shape} with indices {idx.shape}",
                              fix="X is (N, C, spatial...) and I has X's shape (MaxPool's outputs)")
    if not all(isinstance(d, int) for d in x.shape):
        raise imp.symbolic(f"MaxUnpool needs static dims (input {x.shape})")
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs.get("strides", [1] * nd)]
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nd))]
    if len(kernel) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise imp.unsupported(f"MaxUnpool kernel_shape {kernel}, strides {strides}, pads {pads} for "
                              f"{nd} spatial dims", fix="the model is malformed: export it again")
    shape = [int(x.shape[0]), int(x.shape[1])] + [
        (int(x.shape[2 + i]) - 1) * strides[i] - (pads[i] + pads[i + nd]) + kernel[i] for i in range(nd)]
    if len(ins) > 2 and ins[2] is not None:
        asked = imp.ints(ins[2], "MaxUnpool output_shape")
        if asked != shape:
            raise imp.unsupported(
                f"MaxUnpool output_shape={asked} differs from the unpooled shape {shape}: onnx's "
                f"reference scatters into {shape} and pads the ends with zeros, ONNX Runtime indexes "
                f"{asked} with the same flat indices, so the result is ambiguous",
                fix="drop output_shape (or give the unpooled shape) and pad the result explicitly")
    total = math.prod(shape)
    flat_i = g.op("reshape", idx if idx.dtype == DType.I64 else g.op("cast", idx, to=DType.I64),
                  shape=(math.prod(x.shape),))
    flat_x = g.op("reshape", x, shape=(math.prod(x.shape),))
    zeros = g.const(np.zeros((total,), x.dtype.np), x.dtype) if total <= 16 else \
        g.op("expand", g.const(0, x.dtype), shape=(total,))
    y = g.op("scatter_reduce", zeros, flat_i, flat_x, axis=0, reduction="none")
    return [g.op("reshape", y, shape=tuple(shape))]


# ---------------------------------------------------------------------------------------------
# Linear algebra


@_handler("Det")
def _det(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Batched determinant from ``lu``: ``det(P) * prod(diag(U))``. ``det(P)`` is the parity of the
    pivot permutation (row ``i`` of ``P`` has its 1 in column ``p_i``): ``(-1) ** #inversions``,
    counted exactly in integers."""
    g = imp.g
    a = imp.t(ins[0])
    if a.rank < 2 or a.shape[-1] != a.shape[-2] or not isinstance(a.shape[-1], int):
        raise imp.unsupported(f"Det of {a.shape}", fix="Det takes static square matrices (..., n, n)")
    if a.dtype not in (DType.F32, DType.F64):
        if a.dtype not in (DType.F16, DType.BF16):
            raise imp.unsupported(f"Det of {a.dtype.value}", fix="Det takes float matrices")
        return [g.op("cast", _det(imp, node, [g.op("cast", a, to=DType.F32)], attrs)[0], to=a.dtype)]
    n = int(a.shape[-1])
    lead = a.shape[:-2]
    if n == 0:
        return [g.op("expand", g.const(1, a.dtype), shape=lead)]
    p, _l, u = g.op("lu", a)
    diag = g.op("gather", g.op("reshape", u, shape=(*lead, n * n)),
                g.const(np.arange(n, dtype=np.int64) * (n + 1), DType.I64), axis=-1)
    prod = g.op("reduce_prod", diag, axes=(-1,), keepdims=False)
    if n == 1:
        return [prod]
    perm = g.op("argmax", p, axis=-1, keepdims=False)  # (..., n) int64
    pi = g.op("reshape", perm, shape=(*lead, n, 1))
    pj = g.op("reshape", perm, shape=(*lead, 1, n))
    upper = g.const(np.triu(np.ones((n, n), bool), 1), DType.BOOL)  # pairs i < j
    inv = g.op("logical_and", g.op("greater", pi, pj), upper)
    count = g.op("reduce_sum", g.op("cast", inv, to=DType.I64), axes=(-2, -1), keepdims=False)
    two = g.const(2, DType.I64)
    odd = g.op("cast", count - (count / two) * two, to=a.dtype)  # 0 or 1
    sign = g.const(1, a.dtype) - g.const(2, a.dtype) * odd
    return [sign * prod]


# ---------------------------------------------------------------------------------------------
# Sampling grids and regions


def _grid_axis(n: int, align_corners: bool) -> np.ndarray:
    """Normalised sample coordinates along an axis of ``n`` (onnx's reference: pixel centres, or
    the corners -1 and 1 with align_corners; one sample sits at -1, resp. 0)."""
    i = np.arange(n, dtype=np.float64)
    if align_corners:
        return -1.0 + i * (2.0 / (n - 1)) if n > 1 else np.full(n, -1.0)
    return -1.0 + (2.0 * i + 1.0) / n


@_handler("AffineGrid")
def _affine_grid(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``grid[n, ..., :] = theta[n] @ (x, y[, z], 1)`` over the normalised output coordinates (a
    constant: ``size`` must be known when importing, or is supplied by staged execution)."""
    g = imp.g
    theta = imp.t(ins[0])
    size = imp.ints(ins[1], "AffineGrid size")
    if size is None or len(size) not in (4, 5):
        raise imp.unsupported(f"AffineGrid size={size}", fix="size is (N, C, H, W) or (N, C, D, H, W)")
    r = len(size) - 2
    if theta.rank != 3 or theta.shape[1:] != (r, r + 1) or not theta.dtype.is_float:
        raise imp.unsupported(f"AffineGrid theta {theta.shape} ({theta.dtype.value}) for size {size}",
                              fix=f"theta is a float (N, {r}, {r + 1}) tensor")
    if isinstance(theta.shape[0], int) and theta.shape[0] != size[0]:
        raise imp.unsupported(f"AffineGrid theta has batch {theta.shape[0]} but size says {size[0]}",
                              fix="the model is malformed: make size[0] the batch of theta")
    spatial = size[2:]
    align = bool(int(attrs.get("align_corners", 0)))
    axes = [_grid_axis(n, align) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # (z,) y, x over the output positions
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(math.prod(spatial))], axis=-1)
    pts = g.const(base.T.astype(theta.dtype.np), theta.dtype) if base.size <= 16 else \
        imp.param(np.ascontiguousarray(base.T.astype(theta.dtype.np)), None)
    n = theta.shape[0]
    grid = g.op("matmul", theta, g.op("expand", pts, shape=(n, r + 1, math.prod(spatial))))
    grid = g.op("transpose", grid, perm=(0, 2, 1))
    return [g.op("reshape", grid, shape=(n, *spatial, r))]


def _const_array(imp: _Importer, v: Any, what: str) -> np.ndarray:
    """An input's values at import time; a run-time tensor asks staged execution for them."""
    if v is None:
        raise imp.unsupported(f"{what} is missing", fix="the model is malformed: give the input")
    if isinstance(v, Tensor):
        raise imp.needs_values([v], f"{what} places the samples, so it is needed when importing")
    if not isinstance(v, _onnx._Const):
        raise imp.symbolic(f"{what} depends on a symbolic dim")
    return np.asarray(v.array)


def _roi_taps(roi: np.ndarray, scale: float, half_pixel: bool, h: int, w: int, ph: int, pw: int,
              ratio: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One ROI's bilinear taps, exactly as onnx's reference (and ONNX Runtime) place them: per
    output bin, ``grid_h * grid_w`` samples of 4 (position, weight) taps; samples outside the
    feature map have weight 0. Returns positions and weights (ph, pw, samples, 4) and the count."""
    off = 0.5 if half_pixel else 0.0
    x0, y0, x1, y1 = (float(c) * scale - off for c in roi[:4])
    rw, rh = x1 - x0, y1 - y0
    if not half_pixel:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    bh, bw = rh / ph, rw / pw
    gh = ratio if ratio > 0 else int(np.ceil(rh / ph))
    gw = ratio if ratio > 0 else int(np.ceil(rw / pw))
    count = max(gh * gw, 1)
    pos = np.zeros((ph, pw, max(gh * gw, 1), 4), np.int64)
    wts = np.zeros((ph, pw, max(gh * gw, 1), 4), np.float64)
    for i in range(ph):
        for j in range(pw):
            k = 0
            for iy in range(gh):
                y = y0 + i * bh + (iy + 0.5) * bh / gh
                for ix in range(gw):
                    x = x0 + j * bw + (ix + 0.5) * bw / gw
                    k += 1
                    if y < -1.0 or y > h or x < -1.0 or x > w:
                        continue  # outside the feature map: a sample of value 0
                    y, x = max(y, 0.0), max(x, 0.0)
                    yl, xl = int(y), int(x)
                    if yl >= h - 1:
                        yh = yl = h - 1
                        y = float(yl)
                    else:
                        yh = yl + 1
                    if xl >= w - 1:
                        xh = xl = w - 1
                        x = float(xl)
                    else:
                        xh = xl + 1
                    ly, lx = y - yl, x - xl
                    hy, hx = 1.0 - ly, 1.0 - lx
                    pos[i, j, k - 1] = (yl * w + xl, yl * w + xh, yh * w + xl, yh * w + xh)
                    wts[i, j, k - 1] = (hy * hx, hy * lx, ly * hx, ly * lx)
    return pos, wts, count


@_handler("RoiAlign")
def _roi_align(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Bilinear samples gathered from the feature map, weighted and reduced per output bin: the
    average of the samples' interpolated values, or (mode='max') the maximum over the samples of
    their four *weighted* taps, as onnx's reference and ONNX Runtime define it. The ROIs and batch
    indices are needed when importing (staged execution supplies run-time ones): they fix each
    ROI's sample count and positions, so the graph is one gather, a product and a reduction."""
    g = imp.g
    x = imp.t(ins[0])
    if x.rank != 4 or not all(isinstance(d, int) for d in x.shape) or not x.dtype.is_float:
        raise imp.unsupported(f"RoiAlign of {x.shape} ({x.dtype.value})",
                              fix="RoiAlign takes a static float (N, C, H, W) feature map")
    rois = _const_array(imp, ins[1], "RoiAlign rois").astype(np.float64)
    bidx = _const_array(imp, ins[2], "RoiAlign batch_indices").astype(np.int64).reshape(-1)
    n, c, h, w = (int(d) for d in x.shape)
    if rois.ndim != 2 or rois.shape[1] != 4 or rois.shape[0] != bidx.size:
        raise imp.unsupported(f"RoiAlign rois {rois.shape} with {bidx.size} batch indices",
                              fix="rois is (num_rois, 4) and batch_indices (num_rois,)")
    if ((bidx < 0) | (bidx >= n)).any():
        raise imp.unsupported(f"RoiAlign batch index {int(bidx[(bidx < 0) | (bidx >= n)][0])} outside "
                              f"[0, {n})", fix="batch_indices index the feature map's batch")
    mode = str(attrs.get("mode", "avg")).lower()
    ctm = str(attrs.get("coordinate_transformation_mode", "half_pixel" if imp.opset >= 16
                        else "output_half_pixel")).lower()
    if mode not in ("avg", "max") or ctm not in ("half_pixel", "output_half_pixel"):
        raise imp.unsupported(f"RoiAlign mode={mode!r} coordinate_transformation_mode={ctm!r}",
                              fix="mode is avg or max; the mode half_pixel or output_half_pixel")
    ph, pw = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    r = rois.shape[0]
    taps = [_roi_taps(roi, scale, ctm == "half_pixel", h, w, ph, pw, ratio) for roi in rois]
    k = max([t[0].shape[2] for t in taps], default=1)
    if r * ph * pw * k * 4 * c > 1 << 26:
        raise imp.unsupported(f"RoiAlign with {r} ROIs of up to {k} samples per bin would gather "
                              f"{r * ph * pw * k * 4 * c} values", fix="use a sampling_ratio or fewer ROIs")
    pos = np.zeros((r, ph, pw, k, 4), np.int64)
    wts = np.zeros((r, ph, pw, k, 4), np.float64)
    valid = np.zeros((r, ph, pw, k, 4), bool)
    counts = np.ones((r, 1, 1, 1), np.float64)
    for i, (p_, w_, cnt) in enumerate(taps):
        m = p_.shape[2]
        pos[i, :, :, :m] = p_ + bidx[i] * h * w
        wts[i, :, :, :m] = w_
        valid[i, :, :, :m] = True
        counts[i] = cnt
    if r == 0:
        return [g.op("expand", g.const(0, x.dtype), shape=(0, c, ph, pw))]
    feat = g.op("reshape", g.op("transpose", g.op("reshape", x, shape=(n, c, h * w)), perm=(0, 2, 1)),
                shape=(n * h * w, c))
    vals = g.op("gather", feat, imp.param(pos.reshape(-1), None), axis=0)  # (r*ph*pw*k*4, c)
    vals = g.op("reshape", vals, shape=(r, ph, pw, k * 4, c))
    wt = imp.param(wts.reshape(r, ph, pw, k * 4, 1).astype(x.dtype.np), None)
    prod = vals * wt
    if mode == "avg":
        y = g.op("reduce_sum", prod, axes=(3,), keepdims=False)
        y = y / imp.param(counts.astype(x.dtype.np), None)
    else:
        lowest = g.const(-np.inf, x.dtype)
        masked = g.op("where", imp.param(valid.reshape(r, ph, pw, k * 4, 1), None), prod, lowest)
        y = g.op("reduce_max", masked, axes=(3,), keepdims=False)
    return [g.op("transpose", y, perm=(0, 3, 1, 2))]


@_handler("DeformConv")
def _deform_conv(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """2-D deformable convolution: each kernel tap of each output position samples the input
    bilinearly at its grid position plus a run-time offset (zero outside the input, as onnx's
    reference's GridSample with align_corners and ONNX Runtime do), times the optional mask; the
    samples then meet the weights in one grouped matmul (im2col). The taps are computed in the graph
    (the offsets are data), each corner read with one flat gather."""
    g = imp.g
    x = imp.t(ins[0])
    if x.rank != 4 or not all(isinstance(d, int) for d in x.shape) or not x.dtype.is_float:
        raise imp.unsupported(f"DeformConv of {x.shape} ({x.dtype.value})",
                              fix="RLX translates 2-D DeformConv of a static float (N, C, H, W) input")
    w = imp.t(ins[1], x.dtype)
    off = imp.t(ins[2], x.dtype)
    bias = imp.t(ins[3], x.dtype) if len(ins) > 3 and ins[3] is not None else None
    mask = imp.t(ins[4], x.dtype) if len(ins) > 4 and ins[4] is not None else None
    n, c, h, wd = (int(d) for d in x.shape)
    if w.rank != 4 or not all(isinstance(d, int) for d in w.shape) or off.rank != 4:
        raise imp.unsupported(f"DeformConv weights {w.shape}, offsets {off.shape}",
                              fix="W is (oC, C/group, kH, kW), offset (N, 2*offset_group*kH*kW, oH, oW)")
    oc, cpg, kh, kw = (int(d) for d in w.shape)
    kernel = [int(k) for k in attrs.get("kernel_shape", [kh, kw])]
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    dil = [int(d) for d in attrs.get("dilations", [1, 1])]
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    group, ogroup = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    if kernel != [kh, kw] or cpg * group != c or oc % group or c % ogroup:
        raise imp.unsupported(f"DeformConv X {x.shape}, W {w.shape}, kernel_shape {kernel}, group {group}, "
                              f"offset_group {ogroup}", fix="the model is malformed: shapes disagree")
    if h == 1 or wd == 1:
        # onnx's reference normalises sample positions by (size - 1), which is 0 here (NaN results)
        raise imp.unsupported(f"DeformConv of a {h}x{wd} input: onnx's reference divides by size - 1 = 0",
                              fix="pad the input to at least 2x2")
    oh = (h + pads[0] + pads[2] - ((kh - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - ((kw - 1) * dil[1] + 1)) // strides[1] + 1
    k2 = kh * kw
    if tuple(off.shape) != (n, 2 * ogroup * k2, oh, ow) or \
            (mask is not None and tuple(mask.shape) != (n, ogroup * k2, oh, ow)):
        got = None if mask is None else mask.shape
        raise imp.unsupported(f"DeformConv offset {off.shape} / mask {got} for output {oh}x{ow}",
                              fix=f"offset is ({n}, {2 * ogroup * k2}, {oh}, {ow}) and "
                              f"mask ({n}, {ogroup * k2}, {oh}, {ow})")
    dt = x.dtype

    def cf(v: float) -> Tensor:
        return g.const(v, dt)

    # positions (N, G, kH, kW, oH, oW): grid position of each tap plus its offset
    o6 = g.op("reshape", off, shape=(n, ogroup, kh, kw, 2, oh, ow))
    base_h = (np.arange(oh) * strides[0] - pads[0])[None, :] + (np.arange(kh) * dil[0])[:, None]  # (kH, oH)
    base_w = (np.arange(ow) * strides[1] - pads[1])[None, :] + (np.arange(kw) * dil[1])[:, None]  # (kW, oW)
    shp = (n, ogroup, kh, kw, oh, ow)

    def comp(i: int) -> Tensor:
        t = g.op("slice", o6, starts=(i,), stops=(i + 1,), axes=(4,), steps=(1,))
        return g.op("reshape", t, shape=shp)

    py = comp(0) + imp.param(base_h.reshape(1, 1, kh, 1, oh, 1).astype(dt.np), None)
    px = comp(1) + imp.param(base_w.reshape(1, 1, 1, kw, 1, ow).astype(dt.np), None)
    cg = c // ogroup
    table = g.op("reshape", g.op("transpose", g.op("reshape", x, shape=(n, ogroup, cg, h * wd)),
                                 perm=(0, 1, 3, 2)), shape=(n * ogroup * h * wd, cg))
    grp_base = imp.param((np.arange(n * ogroup, dtype=np.int64) * (h * wd)).reshape(n, ogroup, 1, 1, 1, 1),
                         None)
    y0, x0 = g.op("floor", py), g.op("floor", px)
    ly, lx = py - y0, px - x0
    acc: Tensor | None = None
    for dy, wy in ((0, cf(1.0) - ly), (1, ly)):
        yc = y0 + cf(float(dy))
        oky = g.op("logical_and", g.op("greater_equal", yc, cf(0.0)), g.op("less", yc, cf(float(h))))
        yi = g.op("minimum", g.op("maximum", g.op("cast", yc, to=DType.I64), g.const(0, DType.I64)),
                  g.const(h - 1, DType.I64))
        for dx, wx in ((0, cf(1.0) - lx), (1, lx)):
            xc = x0 + cf(float(dx))
            ok = g.op("logical_and", oky, g.op("logical_and", g.op("greater_equal", xc, cf(0.0)),
                                               g.op("less", xc, cf(float(wd)))))
            xi = g.op("minimum", g.op("maximum", g.op("cast", xc, to=DType.I64), g.const(0, DType.I64)),
                      g.const(wd - 1, DType.I64))
            flat = grp_base + yi * g.const(wd, DType.I64) + xi
            v = g.op("gather", table, flat, axis=0)  # (N, G, kH, kW, oH, oW, cg)
            wgt = g.op("where", ok, wy * wx, cf(0.0))
            term = v * g.op("reshape", wgt, shape=(*shp, 1))
            acc = term if acc is None else acc + term
    assert acc is not None
    if mask is not None:
        acc = acc * g.op("reshape", mask, shape=(*shp, 1))
    # columns (N, C, kH, kW, L) with C = offset group major, then (N, group, C/group*kH*kW, L)
    cols = g.op("transpose", acc, perm=(0, 1, 6, 2, 3, 4, 5))
    cols = g.op("reshape", cols, shape=(n, group, cpg * k2, oh * ow))
    wm = g.op("reshape", w, shape=(1, group, oc // group, cpg * k2))
    y = g.op("matmul", g.op("expand", wm, shape=(n, group, oc // group, cpg * k2)), cols)
    y = g.op("reshape", y, shape=(n, oc, oh, ow))
    if bias is not None:
        y = y + g.op("reshape", bias, shape=(1, oc, 1, 1))
    return [y]


# ---------------------------------------------------------------------------------------------
# ConvTranspose in 3-D: onnx_nn translates 1-D and 2-D; a 3-D one is a sum over the kernel's depth
# taps of 2-D transposed convolutions of the depth slices, each placed at its output depth.

_conv_transpose_nd = _onnx._HANDLERS["ConvTranspose"]


@_handler("ConvTranspose")
def _conv_transpose(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if x.rank != 5:
        return list(_conv_transpose_nd(imp, node, ins, attrs))
    from .onnx_nn import _conv_transpose_pads

    g = imp.g
    if not all(isinstance(d, int) for d in x.shape) or not x.dtype.is_float:
        raise imp.unsupported(f"ConvTranspose of {x.shape} ({x.dtype.value})",
                              fix="3-D ConvTranspose needs a static float (N, C, D, H, W) input")
    w = imp.t(ins[1], x.dtype)
    if w.rank != 5 or not all(isinstance(d, int) for d in w.shape):
        raise imp.unsupported(f"ConvTranspose weight {w.shape} for input {x.shape}",
                              fix="W is (C, C_out/group, kD, kH, kW)")
    n, c, d_in, h, wd = (int(v) for v in x.shape)
    kernel = [int(k) for k in attrs.get("kernel_shape", w.shape[2:])]
    if kernel != [int(k) for k in w.shape[2:]]:
        raise imp.unsupported(f"ConvTranspose kernel_shape {kernel} differs from the weight's {w.shape[2:]}",
                              fix="the model is malformed; export it again")
    strides = [int(s) for s in attrs.get("strides", [1, 1, 1])]
    dil = [int(v) for v in attrs.get("dilations", [1, 1, 1])]
    out_pad = [int(p) for p in attrs.get("output_padding", [0, 0, 0])]
    pads = _conv_transpose_pads(imp, attrs, [d_in, h, wd], kernel, strides, dil, out_pad)
    if any(p < 0 for p in pads):
        raise imp.unsupported(f"ConvTranspose pads {pads}", fix="pads are non-negative")
    kd, s, dd = kernel[0], strides[0], dil[0]
    attrs2 = {"strides": strides[1:], "dilations": dil[1:], "output_padding": out_pad[1:],
              "pads": [pads[1], pads[2], pads[4], pads[5]], "group": int(attrs.get("group", 1)),
              "kernel_shape": kernel[1:]}
    # the depth slices as a batch of 2-D inputs: (N * D, C, H, W)
    x2 = g.op("reshape", g.op("transpose", x, perm=(0, 2, 1, 3, 4)), shape=(n * d_in, c, h, wd))
    full = s * (d_in - 1) + 1 + (kd - 1) * dd + out_pad[0]  # output depth before the pads come off
    acc: Tensor | None = None
    for k in range(kd):
        wk = g.op("reshape", g.op("slice", w, starts=(k,), stops=(k + 1,), axes=(2,), steps=(1,)),
                  shape=(*w.shape[:2], *w.shape[3:]))
        y2 = _conv_transpose_nd(imp, node, [x2, wk], attrs2)[0]  # (N * D, Co, Ho, Wo)
        co, ho, wo = (int(v) for v in y2.shape[1:])
        y = g.op("reshape", y2, shape=(n, d_in, 1, co, ho, wo))
        if s > 1:  # stride zeros between the depth slices
            y = g.op("pad", y, pads=(0, 0, 0, 0, 0, 0, 0, 0, s - 1, 0, 0, 0))
        y = g.op("reshape", y, shape=(n, d_in * s, co, ho, wo))
        y = g.op("slice", y, starts=(0,), stops=(s * (d_in - 1) + 1,), axes=(1,), steps=(1,))
        before = k * dd
        after = full - before - (s * (d_in - 1) + 1)
        y = g.op("pad", y, pads=(0, before, 0, 0, 0, 0, after, 0, 0, 0))
        acc = y if acc is None else acc + y
    assert acc is not None
    out = g.op("slice", acc, starts=(pads[0],), stops=(full - pads[3],), axes=(1,), steps=(1,))
    out = g.op("transpose", out, perm=(0, 2, 1, 3, 4))
    if len(ins) > 2 and ins[2] is not None:
        out = out + g.op("reshape", imp.t(ins[2], x.dtype), shape=(1, out.shape[1], 1, 1, 1))
    return [out]

