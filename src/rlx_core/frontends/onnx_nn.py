"""ONNX neural-net operators of real exports, translated into existing RLX IR ops (issue 17).

Resize (opsets 10 to 19) and Upsample, Attention (23 to 25), RMSNormalization, RotaryEmbedding,
NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, GroupNormalization, InstanceNormalization and
GridSample.
The handlers register in :mod:`rlx_core.frontends.onnx`'s table (that module imports this one), so
the ONNX importer stays one entry point, and every backend runs them (no new IR op).

Resize is separable: each resized axis is a fixed linear map from the input positions to the
output positions, computed here at import time in float64 exactly as onnx's reference (and ONNX
Runtime) computes its taps. Nearest is then one ``gather`` per axis (no arithmetic at all), linear
and cubic are a few gathers weighted by constant coefficients, and wide antialias filters are one
``matmul`` by the constant interpolation matrix. Integer inputs are resized by nearest only (the
weighted modes would need ONNX's rounding and saturation, which are refused rather than guessed).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from . import onnx as _onnx
from .onnx import _Const, _handler, _Importer

_FLOATS = (DType.F16, DType.BF16, DType.F32, DType.F64)

# The versions each handler translates exactly (see onnx.op_version_problem): older Resize/Upsample
# versions are read with their own defaults below; newer Attention versions add attributes that are
# refused by name when present.
_onnx._OP_SINCE.update({"Resize": 10, "Upsample": 7, "InstanceNormalization": 6,
                        "NegativeLogLikelihoodLoss": 12, "SoftmaxCrossEntropyLoss": 12,
                        "GroupNormalization": 18})
_onnx._OP_REVIEWED.update({"Attention": 25, "Resize": 19, "NegativeLogLikelihoodLoss": 22,
                           "InstanceNormalization": 22, "GroupNormalization": 21})

#: Inputs (op type, input index) that are float but shape-like: the backend adapter may compile
#: small constant feeds of them in (onnx_backend's freeze_inputs), as it does for integer ones.
SHAPE_LIKE_FLOAT_INPUTS: frozenset[tuple[str, int]] = frozenset({("Resize", 1), ("Resize", 2),
                                                                 ("Upsample", 1)})


def _float_input(imp: _Importer, x: Tensor, op: str, what: str = "input") -> None:
    if x.dtype not in _FLOATS:
        raise imp.unsupported(f"{op} on a {x.dtype.value} {what} is not supported",
                              fix="cast it to float32 in the model before this node")


def _static(imp: _Importer, x: Tensor, axes: Sequence[int], op: str) -> list[int]:
    out = []
    for a in axes:
        d = x.shape[a]
        if not isinstance(d, int):
            raise imp.symbolic(f"{op} over the symbolic axis {a} (size {d!r}) of {x.shape}", [d])
        out.append(d)
    return out


def _bcast(col: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A 1-D per-position array shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    return col.reshape((1,) * axis + (-1,) + (1,) * (rank - axis - 1))


# ---------------------------------------------------------------------------------------------
# Resize / Upsample

_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_CT_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_crop_and_resize", "tf_half_pixel_for_nn")


def _source_coords(ctm: str, in_len: int, out_len: int, scale: float, roi: tuple[float, float] | None,
                   ort: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Output positions -> input coordinates, and where a tf_crop_and_resize coordinate falls outside
    the input (extrapolated). ``ort=False``: onnx's reference (float64; align_corners and
    pytorch_half_pixel use the real-valued output width ``scale * in_len``); ``ort=True``: ONNX
    Runtime's float32 arithmetic on the integer output length, as the spec's formulas read."""
    f: Any = np.float32 if ort else np.float64
    y: Any = np.arange(out_len, dtype=f)
    sc: Any = f(scale)
    out_w = float(sc) * in_len  # the real-valued output length (not floored)
    ref_len = out_len if ort else out_w  # what align_corners / pytorch_half_pixel divide by
    half = f(0.5)
    extra = None
    x: Any
    if ctm == "align_corners":
        x = np.zeros(out_len, f) if ref_len == 1 else y * f(in_len - 1) / f(ref_len - 1)
    elif ctm == "asymmetric":
        x = y / sc
    elif ctm == "tf_half_pixel_for_nn":
        x = (y + half) / sc
    elif ctm == "tf_crop_and_resize":
        assert roi is not None
        r0, r1 = f(roi[0]), f(roi[1])
        if ref_len == 1:
            x = np.full(out_len, (r1 - r0) * f(in_len - 1) / 2, f)
        else:
            x = y * (r1 - r0) * f(in_len - 1) / f(ref_len - 1)
        x = x + r0 * f(in_len - 1)
        extra = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, f(0.0) if ort else f(-0.5), f) if ref_len == 1 else (y + half) / sc - half
    elif ctm == "half_pixel":
        x = (y + half) / sc - half
    else:  # half_pixel_symmetric
        adjustment = f(out_len) / f(out_w)
        x = f(in_len) / f(2) * (f(1) - adjustment) + (y + half) / sc - half
    return np.asarray(x, np.float64), extra


def _taps(mode: str, x: np.ndarray, in_len: int, scale: float, *, nearest_mode: str, cubic_a: float,
          exclude_outside: bool, antialias: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per output position, the input indices (clamped: edge padding) and their float64 weights."""
    if mode == "nearest" and nearest_mode == "simple":
        # Resize-10 / Upsample in ONNX Runtime: truncate when upsampling, ceil when downsampling.
        i = np.ceil(x) if scale < 1 else np.trunc(x)
        idx = np.clip(i, 0, in_len - 1).astype(np.int64)[:, None]
        return idx, np.ones_like(idx, dtype=np.float64)
    xi = np.floor(x)
    ratio = np.where(x == xi, 1.0, x - xi)  # prefer the left neighbour: ratio in (0, 1]
    s = min(scale, 1.0)
    if mode == "nearest":
        ones = np.ones_like(ratio)
        if nearest_mode == "floor":
            up = np.zeros_like(ratio, dtype=bool)
        elif nearest_mode == "ceil":
            up = ones.astype(bool)
        else:
            up = ratio > 0.5 if nearest_mode == "round_prefer_floor" else ratio >= 0.5
        up = up | (ratio == 1.0)  # an integer coordinate: the second neighbour is the point itself
        coeffs = np.stack([~up, up], axis=1).astype(np.float64)
    elif mode == "linear":
        if antialias:
            start = int(np.floor(-1 / s) + 1)
            args = (np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s
            coeffs = np.clip(1 - np.abs(args), 0, 1)
            coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
        else:
            coeffs = np.stack([1 - ratio, ratio], axis=1)
    else:  # cubic
        a = cubic_a
        if antialias:
            start = int(np.floor(-2 / s) + 1)
            t = np.abs(s * (np.arange(start, 2 - start)[None, :] - ratio[:, None]))
            coeffs = np.where(t <= 1, (a + 2) * t**3 - (a + 3) * t**2 + 1,
                              np.where(t < 2, a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a, 0.0))
            coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
        else:
            r = ratio
            coeffs = np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                               ((a + 2) * r - (a + 3)) * r * r + 1,
                               ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                               ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a], axis=1)
    n = coeffs.shape[1]
    # The n indices nearest x (ties to the smaller), as onnx's reference picks them.
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
        tot = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(tot == 0, 1.0, tot)
    return np.clip(idx, 0, in_len - 1), coeffs


def _near_tie(c64: np.ndarray, c32: np.ndarray, nearest_mode: str) -> bool:
    """A nearest-mode coordinate close to its rounding boundary whose value is not exact in both
    float64 and float32: runtimes that compute it with other rounding may pick the other pixel."""
    shift = 0.0 if nearest_mode in ("floor", "ceil") else 0.5
    d = np.abs((c64 - shift) - np.round(c64 - shift))
    near = d < 1e-4
    return bool((near & ((d != 0) | (c64 != c32))).any())


def _dense(idx: np.ndarray, coeffs: np.ndarray, in_len: int) -> np.ndarray:
    """The (out, in) interpolation matrix of per-position taps."""
    out_len, n = idx.shape
    w = np.zeros((out_len, in_len), dtype=np.float64)
    np.add.at(w, (np.repeat(np.arange(out_len), n), idx.reshape(-1)), coeffs.reshape(-1))
    return w


#: A weighted resize with more taps than this per output position is one matmul by the matrix.
_MAX_GATHER_TAPS = 4


def _resize_axis(imp: _Importer, x: Tensor, axis: int, idx: np.ndarray, coeffs: np.ndarray) -> Tensor:
    g = imp.g
    out_len, n = idx.shape
    in_len = int(x.shape[axis])
    one_hot = (np.count_nonzero(coeffs, axis=1) == 1) & np.isclose(coeffs.max(axis=1), 1.0, rtol=0, atol=0)
    if bool(one_hot.all()):
        pick = idx[np.arange(out_len), np.argmax(coeffs, axis=1)]
        if np.array_equal(pick, np.arange(in_len)):
            return x
        return g.op("gather", x, imp.param(pick.astype(np.int64)), axis=axis)
    if n > _MAX_GATHER_TAPS:
        w = _dense(idx, coeffs, in_len)
        r = x.rank
        perm = [a for a in range(r) if a != axis] + [axis]
        inv = [perm.index(a) for a in range(r)]
        xt = x if axis == r - 1 else g.op("transpose", x, perm=tuple(perm))
        y = g.op("matmul", xt, imp.param(np.ascontiguousarray(w.T).astype(x.dtype.np)))
        return y if axis == r - 1 else g.op("transpose", y, perm=tuple(inv))
    acc: Tensor | None = None
    for t in range(n):
        c = coeffs[:, t]
        if not c.any():
            continue
        term = g.op("gather", x, imp.param(idx[:, t].astype(np.int64)), axis=axis)
        term = term * imp.param(_bcast(c, axis, x.rank).astype(x.dtype.np))
        acc = term if acc is None else acc + term
    assert acc is not None
    return acc


def _resize(imp: _Importer, node: Any, x: Tensor, *, mode: str, ctm: str, nearest_mode: str,
            scales: list[float] | None, sizes: list[int] | None, axes: list[int] | None,
            roi: list[float] | None, cubic_a: float = -0.75, exclude_outside: bool = False,
            extrapolation: float = 0.0, antialias: bool = False, policy: str = "stretch") -> Tensor:
    op = node.op_type
    r = x.rank
    if mode not in ("nearest", "linear", "cubic"):
        raise imp.unsupported(f"{op} mode={mode!r} is not supported",
                              fix="use mode 'nearest', 'linear' or 'cubic' (the ONNX modes)")
    if ctm not in _CT_MODES:
        raise imp.unsupported(f"{op} coordinate_transformation_mode={ctm!r} is not supported",
                              fix=f"use one of {', '.join(_CT_MODES)}")
    if nearest_mode not in _NEAREST_MODES:
        raise imp.unsupported(f"{op} nearest_mode={nearest_mode!r} is not supported",
                              fix="use round_prefer_floor, round_prefer_ceil, floor or ceil")
    if mode != "nearest":
        _float_input(imp, x, f"{op} mode={mode!r}")
    if antialias and mode == "nearest":
        raise imp.unsupported(f"{op} antialias=1 with mode='nearest' is not defined by ONNX",
                              fix="use antialias=0, or mode 'linear'/'cubic'")
    ax = list(range(r)) if axes is None else [a % r for a in axes]
    if len(set(ax)) != len(ax):
        raise imp.unsupported(f"{op} axes {axes} repeat an axis", fix="list each axis once")
    k = len(ax)
    if (scales is not None and len(scales) != k) or (sizes is not None and len(sizes) != k):
        raise imp.unsupported(f"{op} has {len(scales if scales is not None else sizes or [])} scales/sizes "
                              f"for {k} axes", fix="give one scale or size per resized axis")
    if roi is not None and len(roi) not in (0, 2 * k):
        raise imp.unsupported(f"{op} roi has {len(roi)} values for {k} axes",
                              fix="give a start and an end per resized axis (2 * len(axes) values)")
    if ctm == "tf_crop_and_resize" and not roi:
        raise imp.unsupported(f"{op} coordinate_transformation_mode='tf_crop_and_resize' needs roi",
                              fix="pass the region of interest as a constant roi input")
    if scales is not None and ctm != "tf_crop_and_resize":
        # A scale of exactly 1 leaves its axis as it is (both runtimes skip it), so that axis (e.g. a
        # dynamic batch) need not be static.
        keep = [j for j in range(k) if float(scales[j]) != 1.0]
        ax, scales, k = [ax[j] for j in keep], [scales[j] for j in keep], len(keep)
        roi = None
        if not ax:
            return x
    in_dims = _static(imp, x, ax, op)
    if sizes is not None:
        sc = [s / d for s, d in zip(sizes, in_dims)]
        outs = list(sizes)
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise imp.unsupported(f"{op} keep_aspect_ratio_policy={policy!r} is not supported",
                                      fix="use stretch, not_larger or not_smaller")
            s0 = min(sc) if policy == "not_larger" else max(sc)
            sc = [s0] * k
            outs = [int(s0 * d + 0.5) for d in in_dims]
    else:
        assert scales is not None
        sc = [float(s) for s in scales]
        if any(not s > 0 for s in sc):
            raise imp.unsupported(f"{op} scales {sc} are not all positive", fix="scales must be > 0")
        outs = [int(s * d) for s, d in zip(sc, in_dims)]
    y = x
    for j, a in enumerate(ax):
        pair = (float(roi[j]), float(roi[j + k])) if roi else None
        if math.isclose(sc[j], 1.0) and outs[j] == in_dims[j] and (
                pair is None or (math.isclose(pair[0], 0.0) and math.isclose(pair[1], 1.0))):
            continue  # identity along this axis (as onnx's reference and ONNX Runtime skip it)
        if outs[j] == 0:
            raise imp.unsupported(f"{op} resizes axis {a} to length 0", fix="check the scales/sizes")
        kw = dict(nearest_mode=nearest_mode, cubic_a=cubic_a, exclude_outside=exclude_outside,
                  antialias=antialias)
        src, extra = _source_coords(ctm, in_dims[j], outs[j], sc[j], pair)
        idx, coeffs = _taps(mode, src, in_dims[j], sc[j], **kw)  # type: ignore[arg-type]
        if nearest_mode != "simple":
            # onnx's reference (float64) and ONNX Runtime (float32, integer output length) must agree,
            # or the model's numbers depend on the runtime: refuse rather than pick one silently.
            src_o, extra_o = _source_coords(ctm, in_dims[j], outs[j], sc[j], pair, ort=True)
            idx_o, coeffs_o = _taps(mode, src_o, in_dims[j], sc[j], **kw)  # type: ignore[arg-type]
            w, w_o = _dense(idx, coeffs, in_dims[j]), _dense(idx_o, coeffs_o, in_dims[j])
            tol = 0.0 if mode == "nearest" else 1e-5
            same_extra = (extra is None) == (extra_o is None) and (
                extra is None or np.array_equal(extra, np.asarray(extra_o)))
            if not same_extra or float(np.abs(w - w_o).max()) > tol or (
                    mode == "nearest" and _near_tie(src, src_o, nearest_mode)):
                raise imp.unsupported(
                    f"{op} mode={mode!r} coordinate_transformation_mode={ctm!r} with scale {sc[j]:g} on "
                    f"axis {a} ({in_dims[j]} -> {outs[j]}) is ambiguous: onnx's reference and ONNX Runtime "
                    f"compute different {'source pixels' if mode == 'nearest' else 'weights'} for it "
                    f"(a coordinate on a rounding boundary in float32, or a fractional output length)",
                    fix="give the output size as the sizes input instead of scales, or a scale whose "
                        "output length scale * input is a whole number")
        y = _resize_axis(imp, y, a, idx, coeffs)
        if extra is not None and extra.any():
            inside = imp.param(_bcast(~extra, a, r))
            y = imp.g.op("where", inside, y, imp.g.const(extrapolation, y.dtype))
    return y


def _const_floats(imp: _Importer, v: Any, what: str) -> list[float] | None:
    """An optional float input that must be known at import time (None when absent or empty)."""
    if v is None:
        return None
    if not isinstance(v, _Const):
        raise imp.unsupported(f"{what} is computed at run time, so the output shape (or the "
                              f"interpolation weights) would be data-dependent",
                              fix="export with constant scales/sizes/roi (e.g. torch F.interpolate with "
                                  "a fixed scale_factor or size)")
    arr = v.array.reshape(-1)
    return [float(a) for a in arr] if arr.size else None


def _attr_str(attrs: dict, name: str, default: str) -> str:
    v = attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _sizes_over_symbols(imp: _Importer, x: Tensor, sizes: list[Any], axes: list[int] | None,
                        policy: str) -> tuple[list[int], list[int] | None]:
    """Resize sizes read from the symbolic input shape (Shape -> Gather -> Concat): an axis whose
    size is its own symbolic input size is left alone (identity), so it is dropped from the resized
    axes; any other symbolic size would need interpolation weights that depend on the binding."""
    if not any(isinstance(d, _onnx.SymInt) for d in sizes):
        return [int(d) for d in sizes], axes
    r = x.rank
    ax = list(range(r)) if axes is None else [a % r for a in axes]
    if len(ax) != len(sizes):
        raise imp.unsupported(f"Resize has {len(sizes)} sizes for {len(ax)} axes",
                              fix="give one size per resized axis")
    keep: list[int] = []
    for j, (a, d) in enumerate(zip(ax, sizes)):
        if isinstance(d, _onnx.SymInt):
            if d.expr != x.shape[a]:
                raise imp.symbolic(f"Resize sizes {sizes}: axis {a} of the input {x.shape} would become {d}; "
                                   f"interpolating to a symbolic length needs the weights at run time",
                                   list(d.syms))
            if policy != "stretch":
                raise imp.symbolic(f"Resize keep_aspect_ratio_policy={policy!r} with the symbolic sizes "
                                   f"{sizes}", list(d.syms))
            continue
        keep.append(j)
    return [int(sizes[j]) for j in keep], [ax[j] for j in keep]


@_handler("Resize")
def _resize_h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    mode = _attr_str(attrs, "mode", "nearest")

    def get(i: int) -> Any:
        return ins[i] if len(ins) > i else None

    if imp.opset < 11:  # Resize-10: (X, scales), asymmetric coordinates, ONNX Runtime's legacy nearest
        scales = _const_floats(imp, get(1), "Resize scales")
        if scales is None:
            raise imp.unsupported("Resize-10 without scales", fix="pass the scales input")
        return [_resize(imp, node, x, mode=mode, ctm="asymmetric", nearest_mode="simple", scales=scales,
                        sizes=None, axes=None, roi=None)]
    roi = _const_floats(imp, get(1), "Resize roi")
    scales = _const_floats(imp, get(2), "Resize scales")
    sizes_v = get(3)
    axes = [int(a) for a in attrs["axes"]] if "axes" in attrs else None
    sizes: list[int] | None = None
    if sizes_v is not None:
        sizes, axes = _sizes_over_symbols(imp, x, imp.dims(sizes_v, "Resize sizes"), axes,
                                          _attr_str(attrs, "keep_aspect_ratio_policy", "stretch"))
    if sizes is not None and len(sizes) == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        if sizes_v is not None and not isinstance(sizes_v, _Const) and scales is None:
            return [x]  # every resized axis keeps its (symbolic) size: sizes came from Shape(x)
        raise imp.unsupported("Resize needs exactly one of scales and sizes",
                              fix="pass either non-empty scales or non-empty sizes")
    ctm = _attr_str(attrs, "coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_half_pixel_for_nn" and imp.opset >= 13:
        raise imp.unsupported("Resize coordinate_transformation_mode='tf_half_pixel_for_nn' was removed "
                              "in Resize-13", fix="the model is malformed; check it with onnx.checker")
    y = _resize(imp, node, x, mode=mode, ctm=ctm, nearest_mode=_attr_str(attrs, "nearest_mode",
                                                                          "round_prefer_floor"),
                scales=scales, sizes=sizes, axes=axes, roi=roi if ctm == "tf_crop_and_resize" else None,
                cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
                exclude_outside=bool(int(attrs.get("exclude_outside", 0))),
                extrapolation=float(attrs.get("extrapolation_value", 0.0)),
                antialias=bool(int(attrs.get("antialias", 0))),
                policy=_attr_str(attrs, "keep_aspect_ratio_policy", "stretch"))
    return [y]


@_handler("Upsample")
def _upsample(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if "scales" in attrs:  # Upsample-7: an attribute
        scales = [float(s) for s in attrs["scales"]]
    else:
        got = _const_floats(imp, ins[1] if len(ins) > 1 else None, "Upsample scales")
        if got is None:
            raise imp.unsupported("Upsample without scales", fix="pass the scales")
        scales = got
    if any(s < 1 for s in scales):
        raise imp.unsupported(f"Upsample scales {scales} are below 1", fix="Upsample scales must be >= 1")
    mode = _attr_str(attrs, "mode", "nearest")
    return [_resize(imp, node, x, mode=mode, ctm="asymmetric", nearest_mode="simple", scales=scales,
                    sizes=None, axes=None, roi=None)]


# ---------------------------------------------------------------------------------------------
# Normalisations


def _up32(imp: _Importer, x: Tensor) -> Tensor:
    """Half-precision values in float32 (ONNX's stash_type=1 default): squares overflow in f16."""
    return imp.g.op("cast", x, to=DType.F32) if x.dtype in (DType.F16, DType.BF16) else x


def _normalize(imp: _Importer, x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over ``axes``, the variance of centred values (no cancellation)."""
    g = imp.g
    c = x - g.op("reduce_mean", x, axes=axes, keepdims=True)
    var = g.op("reduce_mean", c * c, axes=axes, keepdims=True)
    return c * g.op("rsqrt", var + g.const(eps, x.dtype))


def _stash(imp: _Importer, node: Any, attrs: dict) -> None:
    st = int(attrs.get("stash_type", 1))
    if st != 1:
        raise imp.unsupported(f"{node.op_type} stash_type={st} is not supported",
                              fix="use stash_type=1 (compute the statistics in float32, the default)")


def _affine_to(imp: _Importer, v: Any, shape: tuple[Any, ...], dt: DType, what: str) -> Tensor:
    """A scale/bias broadcast to exactly ``shape`` (the normalised trailing dims)."""
    if isinstance(v, _Const) and all(isinstance(d, int) for d in shape):
        try:
            arr = np.broadcast_to(v.array.astype(dt.np), shape)
        except ValueError:
            raise imp.unsupported(f"{what} {v.array.shape} does not broadcast to {shape}",
                                  fix="check the model") from None
        return imp.param(np.ascontiguousarray(arr))
    t = imp.t(v, dt)
    return t if t.shape == shape else imp.g.op("expand", t, shape=shape)


@_handler("RMSNormalization")
def _rms_normalization(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    _stash(imp, node, attrs)
    x = imp.t(ins[0])
    _float_input(imp, x, "RMSNormalization")
    axis = int(attrs.get("axis", -1)) % max(x.rank, 1)
    gamma = _affine_to(imp, ins[1], x.shape[axis:], x.dtype, "RMSNormalization scale")
    return [imp.g.op("rms_norm", x, gamma, axis=axis, eps=float(attrs.get("epsilon", 1e-5)))]


@_handler("InstanceNormalization")
def _instance_norm(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x0 = imp.t(ins[0])
    _float_input(imp, x0, "InstanceNormalization")
    if x0.rank < 3:
        raise imp.unsupported(f"InstanceNormalization of a rank-{x0.rank} input",
                              fix="input is (N, C, D1, ...)")
    x = _up32(imp, x0)
    view = (x.shape[1],) + (1,) * (x.rank - 2)
    scale = g.op("reshape", imp.t(ins[1], x.dtype), shape=view)
    bias = g.op("reshape", imp.t(ins[2], x.dtype), shape=view)
    y = _normalize(imp, x, tuple(range(2, x.rank)), float(attrs.get("epsilon", 1e-5))) * scale + bias
    return [y if y.dtype == x0.dtype else g.op("cast", y, to=x0.dtype)]


@_handler("GroupNormalization")
def _group_norm(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    _stash(imp, node, attrs)
    x0 = imp.t(ins[0])
    _float_input(imp, x0, "GroupNormalization")
    groups = int(attrs["num_groups"])
    c = x0.shape[1]
    if not isinstance(c, int) or groups <= 0 or c % groups:
        raise imp.unsupported(f"GroupNormalization of {c} channels in {groups} groups",
                              fix="the channel count must be static and divisible by num_groups")
    x = _up32(imp, x0)
    spatial = list(x.shape[2:])
    per_group = _onnx.s_prod([c // groups, *map(_onnx._sym_of, spatial)])
    grouped = imp.reshape(x, [imp.sdims(x)[0], groups, per_group], "GroupNormalization groups")
    y = imp.reshape(_normalize(imp, grouped, (2,), float(attrs.get("epsilon", 1e-5))), imp.sdims(x))
    view = (c,) + (1,) * len(spatial)

    def per_channel(v: Any) -> Tensor:
        if imp.opset < 21:  # GroupNormalization-18: one scale/bias per group
            if not isinstance(v, _Const):
                t = g.op("reshape", imp.t(v, x.dtype), shape=(groups, 1))
                t = g.op("expand", t, shape=(groups, c // groups))
                return g.op("reshape", t, shape=view)
            return imp.param(np.repeat(v.array.astype(x.dtype.np), c // groups).reshape(view))
        return g.op("reshape", imp.t(v, x.dtype), shape=view)

    y = y * per_channel(ins[1]) + per_channel(ins[2])
    return [y if y.dtype == x0.dtype else g.op("cast", y, to=x0.dtype)]


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding


@_handler("RotaryEmbedding")
def _rotary(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    _float_input(imp, x, "RotaryEmbedding")
    interleaved = bool(int(attrs.get("interleaved", 0)))
    heads = int(attrs.get("num_heads", 0))
    if x.rank == 4:  # (B, H, S, D): the caches broadcast over H
        b, s, d = x.shape[0], x.shape[2], x.shape[3]
        xv = x
    elif x.rank == 3:  # (B, S, H*D)
        if heads <= 0 or not isinstance(x.shape[2], int) or x.shape[2] % heads:
            raise imp.unsupported(f"RotaryEmbedding of a 3-D input {x.shape} needs num_heads dividing its "
                                  f"last dim (num_heads={heads})", fix="set num_heads")
        b, s, d = x.shape[0], x.shape[1], x.shape[2] // heads
        xv = g.op("reshape", x, shape=(b, s, heads, d))
    else:
        raise imp.unsupported(f"RotaryEmbedding of a rank-{x.rank} input", fix="input is 3-D or 4-D")
    if not isinstance(d, int):
        raise imp.symbolic(f"RotaryEmbedding with a symbolic head size {d!r}")
    rd = int(attrs.get("rotary_embedding_dim", 0)) or d
    if rd > d or rd % 2:
        raise imp.unsupported(f"RotaryEmbedding rotary_embedding_dim={rd} for head size {d}",
                              fix="rotary_embedding_dim must be even and at most the head size")
    half = rd // 2
    cos, sin = imp.t(ins[1], x.dtype), imp.t(ins[2], x.dtype)
    pos = ins[3] if len(ins) > 3 else None
    if pos is not None:  # caches (max_pos, rd/2) indexed by position_ids (B, S)
        p = imp.t(pos)
        cos, sin = g.op("gather", cos, p, axis=0), g.op("gather", sin, p, axis=0)
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise imp.unsupported(f"RotaryEmbedding caches {cos.shape}/{sin.shape} do not end in "
                              f"rotary_embedding_dim/2 = {half}", fix="check the cos/sin caches")
    hax = 1 if x.rank == 4 else 2  # where the heads axis goes in the (B, S, half) caches
    cshape = (cos.shape[0], 1, cos.shape[1], half) if hax == 1 else (cos.shape[0], cos.shape[1], 1, half)
    cos, sin = g.op("reshape", cos, shape=cshape), g.op("reshape", sin, shape=cshape)
    last = 3
    if interleaved:
        x1 = g.op("slice", xv, starts=(0,), stops=(rd,), axes=(last,), steps=(2,))
        x2 = g.op("slice", xv, starts=(1,), stops=(rd,), axes=(last,), steps=(2,))
    else:
        x1 = g.op("slice", xv, starts=(0,), stops=(half,), axes=(last,), steps=(1,))
        x2 = g.op("slice", xv, starts=(half,), stops=(rd,), axes=(last,), steps=(1,))
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        sh = tuple(real.shape)
        pair = g.op("concat", g.op("reshape", real, shape=(*sh, 1)), g.op("reshape", imag, shape=(*sh, 1)),
                    axis=4)
        rot = g.op("reshape", pair, shape=(*sh[:3], rd))
    else:
        rot = g.op("concat", real, imag, axis=last)
    if rd < d:
        rot = g.op("concat", rot, g.op("slice", xv, starts=(rd,), stops=(d,), axes=(last,), steps=(1,)),
                   axis=last)
    return [rot if x.rank == 4 else g.op("reshape", rot, shape=x.shape)]


# ---------------------------------------------------------------------------------------------
# Losses


def _nll(imp: _Importer, node: Any, logp: Tensor, target: Tensor, weight: Any, attrs: dict) -> Tensor:
    """Negative log-likelihood of ``logp`` (N, C, d...) at integer ``target`` (N, d...). The class
    pick is a one-hot select (exact: one term, the rest zeros), so an ignored or out-of-range target
    reads nothing."""
    g = imp.g
    reduction = _attr_str(attrs, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise imp.unsupported(f"{node.op_type} reduction={reduction!r}", fix="use none, sum or mean")
    if logp.rank < 2 or target.rank != logp.rank - 1:
        raise imp.unsupported(f"{node.op_type} input {logp.shape} with target {target.shape}",
                              fix="input is (N, C, d1, ...) and target (N, d1, ...)")
    c = logp.shape[1]
    if not isinstance(c, int):
        raise imp.symbolic(f"{node.op_type} over a symbolic class count {c!r}")
    r = logp.rank
    perm = (0, *range(2, r), 1)
    lp = g.op("transpose", logp, perm=perm) if r > 2 else logp  # (N, d..., C)
    if target.dtype not in (DType.I32, DType.I64):
        raise imp.unsupported(f"{node.op_type} target of dtype {target.dtype.value}",
                              fix="target is int32/int64")
    tgt = g.op("reshape", target, shape=(*target.shape, 1))
    classes = g.op("iota", shape=(c,), axis=0, dtype=target.dtype)
    onehot = g.op("equal", tgt, classes)  # (N, d..., C)
    zero = g.const(0.0, logp.dtype)
    picked = g.op("reduce_sum", g.op("where", onehot, lp, zero), axes=(r - 1,), keepdims=False)
    loss = g.op("neg", picked)
    ignore = attrs.get("ignore_index")
    keep = None
    if ignore is not None:
        keep = g.op("not_equal", target, g.const(int(ignore), target.dtype))
    w: Tensor | None = None
    if weight is not None:
        wt = imp.t(weight, logp.dtype)
        w = g.op("reduce_sum", g.op("where", onehot, wt, zero), axes=(r - 1,), keepdims=False)
        if keep is not None:
            w = g.op("where", keep, w, zero)
    elif keep is not None:
        w = g.op("cast", keep, to=logp.dtype)
    if w is not None:
        loss = loss * w
    if keep is not None:
        loss = g.op("where", keep, loss, zero)  # -x * 0 would be -0.0; ONNX writes 0
    if reduction == "none":
        return loss
    axes = tuple(range(loss.rank))
    total = g.op("reduce_sum", loss, axes=axes, keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return g.op("reduce_mean", loss, axes=axes, keepdims=False)
    return total / g.op("reduce_sum", w, axes=axes, keepdims=False)


@_handler("NegativeLogLikelihoodLoss")
def _nll_loss(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, node.op_type)
    return [_nll(imp, node, x, imp.t(ins[1]), ins[2] if len(ins) > 2 else None, attrs)]


@_handler("SoftmaxCrossEntropyLoss")
def _sce_loss(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, node.op_type)
    logp = imp.g.op("log_softmax", x, axis=1)
    return [_nll(imp, node, logp, imp.t(ins[1]), ins[2] if len(ins) > 2 else None, attrs), logp]


# ---------------------------------------------------------------------------------------------
# Attention (23 to 25: masks, causal, GQA, past/present, nonpad_kv_seqlen, sliding windows, softcap),
# decomposed as onnx's reference computes it


def _to_heads(imp: _Importer, t: Tensor, heads: int, what: str) -> Tensor:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hd = t.shape
    if not isinstance(hd, int) or hd % heads:
        raise imp.unsupported(f"Attention {what} hidden size {hd!r} is not a multiple of {heads} heads",
                              fix="set q_num_heads/kv_num_heads to divide the hidden sizes")
    t = imp.g.op("reshape", t, shape=(b, s, heads, hd // heads))
    return imp.g.op("transpose", t, perm=(0, 2, 1, 3))


@_handler("Attention")
def _attention(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    op = "Attention"
    get = [ins[i] if len(ins) > i else None for i in range(7)]
    q, k, v = (imp.t(get[i]) for i in range(3))
    for t, n in ((q, "Q"), (k, "K"), (v, "V")):
        _float_input(imp, t, op, n)
    left, right = int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1))
    if left < -1 or right < -1:
        raise imp.unsupported(f"Attention window sizes ({left}, {right}) below -1",
                              fix="a window size is -1 (unbounded) or >= 0")
    dt = q.dtype
    rank3 = q.rank == 3
    if not rank3 and imp.opset >= 25 and ("q_num_heads" in attrs or "kv_num_heads" in attrs):
        raise imp.unsupported("Attention-25 with 4-D inputs must not set q_num_heads/kv_num_heads",
                              fix="drop the attributes (the heads are the inputs' axis 1)")
    if rank3:
        if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise imp.unsupported("3-D Attention needs q_num_heads and kv_num_heads",
                                  fix="set both attributes (the model is malformed without them)")
        q = _to_heads(imp, q, int(attrs["q_num_heads"]), "Q")
        k = _to_heads(imp, k, int(attrs["kv_num_heads"]), "K")
        v = _to_heads(imp, v, int(attrs["kv_num_heads"]), "V")
    elif q.rank != 4 or k.rank != 4 or v.rank != 4:
        raise imp.unsupported(f"Attention of Q {q.shape}, K {k.shape}, V {v.shape}",
                              fix="Q, K and V are all 3-D (B, S, H*D) or all 4-D (B, H, S, D)")
    dq = q.shape[3]
    if not isinstance(dq, int):
        raise imp.symbolic(f"Attention with a symbolic head size {dq!r}")
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(dq)
    # onnx scales Q and K by sqrt(scale) each (rounded to the input dtype), not the scores.
    sq = g.const(float(np.asarray(np.sqrt(np.float64(scale)), dt.np if dt != DType.BF16 else np.float32)), dt)
    past_k, past_v = get[4], get[5]
    if (past_k is None) != (past_v is None):
        raise imp.unsupported("Attention with only one of past_key/past_value",
                              fix="pass both or neither")
    past_len = 0
    if past_k is not None:
        pk, pv = imp.t(past_k, dt), imp.t(past_v, dt)
        plen = pk.shape[2]
        if not isinstance(plen, int):
            raise imp.symbolic(f"Attention with a symbolic past length {plen!r}")
        past_len = plen
        k = g.op("concat", pk, k, axis=2)
        v = g.op("concat", pv, v, axis=2)
    present_k, present_v = k, v
    hq, hk = q.shape[1], k.shape[1]
    lq, lk = q.shape[2], k.shape[2]
    if not isinstance(lq, int) or not isinstance(lk, int):
        raise imp.symbolic(f"Attention with symbolic sequence lengths ({lq!r}, {lk!r})")
    if hq != hk:
        if not isinstance(hq, int) or not isinstance(hk, int) or hq % hk or v.shape[1] != hk:
            raise imp.unsupported(f"Attention with {hq} query heads and {hk} key heads",
                                  fix="the query heads must be a multiple of the key/value heads (GQA)")
        rep = hq // hk

        def repeat(t: Tensor) -> Tensor:  # [h0, h0, h1, h1, ...] as onnx's np.repeat(axis=1)
            b, h, s, d = t.shape
            t = g.op("reshape", t, shape=(b, h, 1, s, d))
            t = g.op("expand", t, shape=(b, h, rep, s, d))
            return g.op("reshape", t, shape=(b, hq, s, d))

        k, v = repeat(k), repeat(v)
    # The additive bias: 0 where a key is visible, -inf where masked.
    bias: Tensor | None = None
    const_bias: np.ndarray | None = np.zeros((lq, lk), np.float64)
    ninf = g.const(-np.inf, dt)
    zero = g.const(0.0, dt)
    mask = get[3]
    if mask is not None:
        m = imp.t(mask)
        if m.dtype is DType.BOOL:
            m = g.op("where", m, zero, ninf)
        elif m.dtype != dt:
            m = g.op("cast", m, to=dt)
        ml = m.shape[-1]
        if isinstance(ml, int) and ml < lk:  # a mask shorter than the keys pads with "masked"
            m = g.op("pad", m, pads=(0,) * (2 * m.rank - 1) + (lk - ml,), value=-np.inf)
        bias, const_bias = m, None
    nonpad = get[6]
    if nonpad is not None and past_k is not None:
        raise imp.unsupported("Attention with both nonpad_kv_seqlen and past_key/past_value",
                              fix="use one KV cache form: the model is malformed")
    # Causal and window frontiers: query i (in this block) sees key j by its distance i + offset - j,
    # where offset is the past length, or per batch nonpad_kv_seqlen[b] - q_len (an external cache).
    diff_c: np.ndarray = np.arange(lq)[:, None] + past_len - np.arange(lk)[None, :]  # (q, kv)
    diff: Any = diff_c
    seqlen: Tensor | None = None
    if nonpad is not None:
        seqlen = imp.t(nonpad, DType.I64)
        if seqlen.rank != 1:
            raise imp.unsupported(f"Attention nonpad_kv_seqlen of shape {seqlen.shape}",
                                  fix="nonpad_kv_seqlen is (batch,)")
        off = g.op("reshape", seqlen - g.const(lq, DType.I64), shape=(seqlen.shape[0], 1, 1, 1))
        diff = g.op("reshape", imp.param(diff_c.astype(np.int64)), shape=(1, 1, lq, lk)) + off
        const_bias = None
    terms: list[tuple[np.ndarray | None, Any]] = []  # (constant allowed, or run-time allowed)
    if int(attrs.get("is_causal", 0)):
        terms.append((diff_c >= 0, None) if seqlen is None else (None, g.op("greater_equal", diff,
                                                                            g.const(0, DType.I64))))
    for size, sign in ((left, 1), (right, -1)):
        if size < 0:
            continue
        if seqlen is None:
            terms.append((sign * diff_c <= size, None))
        else:
            d = diff if sign == 1 else g.op("neg", diff)
            terms.append((None, g.op("less_equal", d, g.const(size, DType.I64))))
    if seqlen is not None:  # keys past each batch's valid length are padding
        keys = g.op("reshape", g.op("iota", shape=(lk,), axis=0, dtype=DType.I64), shape=(1, 1, 1, lk))
        terms.append((None, g.op("less", keys, g.op("reshape", seqlen, shape=(seqlen.shape[0], 1, 1, 1)))))
    for allowed_c, allowed_t in terms:
        if allowed_c is not None:
            add = np.where(allowed_c, 0.0, -np.inf)
            if const_bias is not None:
                const_bias = const_bias + add
            t = imp.param(add.astype(dt.np))
        else:
            t = g.op("where", allowed_t, zero, ninf)
        bias = t if bias is None else bias + t
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    prec = attrs.get("softmax_precision")
    prec_dt = None if prec is None else _onnx._ONNX_TO_DTYPE.get(int(prec))
    wants_qk = len(node.output) > 3 and bool(node.output[3])
    plain = (mask is None and seqlen is None and left < 0 and right < 0 and past_len == 0 and not wants_qk
             and float(attrs.get("softcap", 0.0)) <= 0 and prec_dt in (None, dt) and q.shape[3] == k.shape[3]
             and dt in (DType.F32, DType.F64))  # half types: the decomposition rounds as onnx does
    qk_out: Tensor | None = None
    if plain:
        # No mask but (top-left) causal, nothing else: the HIR attention op, which backends fuse. Its
        # finite mask value never shows: key 0 is visible to every query, so no row is fully masked.
        y = g.op("attention", q, k, v, mask="causal" if int(attrs.get("is_causal", 0)) else "none",
                 scale=float(scale))
    else:
        kt = g.op("transpose", k * sq, perm=(0, 1, 3, 2))
        qk = g.op("matmul", q * sq, kt)
        softcap = float(attrs.get("softcap", 0.0))
        if softcap > 0:
            c = g.const(softcap, dt)
            qk = g.op("tanh", qk / c) * c
        scores = qk if bias is None else qk + bias
        if mode not in (0, 1, 2, 3):
            raise imp.unsupported(f"Attention qk_matmul_output_mode={mode}", fix="use 0, 1, 2 or 3")
        if wants_qk and ((mode == 0 and softcap > 0) or (mode == 2 and len(terms) > 0)):
            # onnx's reference gives the softcapped scores for mode 0 and adds the causal/window/padding
            # masks for mode 2; ONNX Runtime gives the raw scores and adds attn_mask only.
            raise imp.unsupported(
                f"Attention qk_matmul_output_mode={mode} with "
                f"{'softcap' if mode == 0 else 'is_causal, a window or nonpad_kv_seqlen'} is ambiguous: "
                f"onnx's reference and ONNX Runtime return different qk_matmul_output values",
                fix="do not use the qk_matmul_output output (output 3) of this node, or use mode 1 "
                    "(softcapped scores) or 3 (probabilities)")
        qk_out = {0: qk, 1: qk, 2: scores}.get(mode)
        sm_in = scores
        if prec is not None:
            pdt = _onnx._ONNX_TO_DTYPE.get(int(prec))
            if pdt is None or pdt not in _FLOATS:
                raise imp.unsupported(f"Attention softmax_precision={prec}", fix="use a float type")
            if pdt != dt:
                sm_in = g.op("cast", scores, to=pdt)
        p = g.op("softmax", sm_in, axis=-1)
        # A query row whose every key is masked gives 0 (not NaN), as onnx's reference does.
        if const_bias is None:
            assert bias is not None
            row_masked = g.op("equal", g.op("reduce_max", bias, axes=(bias.rank - 1,), keepdims=True), ninf)
            p = g.op("where", row_masked, g.const(0.0, p.dtype), p)
        elif bool(np.isneginf(const_bias.max(axis=-1)).any()):
            rows = np.isneginf(const_bias.max(axis=-1, keepdims=True))
            p = g.op("where", imp.param(rows), g.const(0.0, p.dtype), p)
        if p.dtype != dt:
            p = g.op("cast", p, to=dt)
        if mode == 3:
            qk_out = p
        y = g.op("matmul", p, v)
    if rank3:
        b, h, s, d = y.shape
        y = g.op("reshape", g.op("transpose", y, perm=(0, 2, 1, 3)),
                 shape=(b, s, h * d if isinstance(h, int) and isinstance(d, int) else -1))
    return [y, present_k, present_v, qk_out]


# ---------------------------------------------------------------------------------------------
# GridSample (16 to 22): the sampling points are run-time data, so the taps are computed in the
# graph (float32 as onnx's reference) and read with one flat gather per tap combination


def _reflect(imp: _Importer, x: Tensor, lo: float, hi: float) -> Tensor:
    """onnx's _gs_reflect: fold x into [lo, hi] by reflecting at the near border repeatedly."""
    g = imp.g
    rng = hi - lo

    def c(v: float) -> Tensor:
        return g.const(v, x.dtype)

    if rng == 0:
        return g.op("where", g.op("equal", x, x), c(lo), x)  # every point is the single pixel
    below, above = g.op("less", x, c(lo)), g.op("greater", x, c(hi))
    dx = g.op("where", below, c(lo) - x, x - c(hi))
    n = g.op("floor", dx / c(rng))
    r = dx - n * c(rng)
    even = g.op("equal", n - g.op("floor", n / c(2.0)) * c(2.0), c(0.0))
    low_side = g.op("where", even, c(lo) + r, c(hi) - r)
    high_side = g.op("where", even, c(hi) - r, c(lo) + r)
    return g.op("where", below, low_side, g.op("where", above, high_side, x))


def _cubic_w(imp: _Importer, t: Tensor) -> list[Tensor]:
    g = imp.g
    a = -0.75

    def c(v: float) -> Tensor:
        return g.const(v, t.dtype)

    t1, u, u1 = t + c(1.0), c(1.0) - t, c(2.0) - t
    return [((c(a) * t1 - c(5 * a)) * t1 + c(8 * a)) * t1 - c(4 * a),
            ((c(a + 2) * t - c(a + 3)) * t) * t + c(1.0),
            ((c(a + 2) * u - c(a + 3)) * u) * u + c(1.0),
            ((c(a) * u1 - c(5 * a)) * u1 + c(8 * a)) * u1 - c(4 * a)]


@_handler("GridSample")
def _grid_sample(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    op = "GridSample"
    x, grid = imp.t(ins[0]), imp.t(ins[1])
    _float_input(imp, x, op)
    _float_input(imp, grid, op, "grid")
    mode = _attr_str(attrs, "mode", "linear" if imp.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad_mode = _attr_str(attrs, "padding_mode", "zeros")
    align = bool(int(attrs.get("align_corners", 0)))
    if mode not in ("nearest", "linear", "cubic") or pad_mode not in ("zeros", "border", "reflection"):
        raise imp.unsupported(f"{op} mode={mode!r} padding_mode={pad_mode!r}",
                              fix="mode is nearest/linear/cubic, padding_mode zeros/border/reflection")
    nd = x.rank - 2
    if nd < 1 or grid.rank != nd + 2 or grid.shape[-1] != nd:
        raise imp.unsupported(f"{op} of X {x.shape} with grid {grid.shape}",
                              fix="grid is (N, *out_spatial, spatial rank of X)")
    if mode == "cubic" and nd != 2:
        raise imp.unsupported(f"{op} mode='cubic' on {nd} spatial dims", fix="bicubic is 2-D only")
    if mode == "cubic" and pad_mode == "border":
        # onnx's reference clamps the sampling point, then the taps; ONNX Runtime (and PyTorch) clamp
        # only the 4x4 taps: results differ near the border, so neither is picked silently.
        raise imp.unsupported(f"{op} mode='cubic' with padding_mode='border' is ambiguous: onnx's reference "
                              f"and ONNX Runtime compute different values near the border",
                              fix="use padding_mode 'zeros' or 'reflection', or mode 'linear'")
    dims = _static(imp, x, range(2, x.rank), op)
    out_sp = _static(imp, grid, range(grid.rank - 1), op)  # (N, *out_spatial)
    nb, c_ = x.shape[0], x.shape[1]
    if nb != out_sp[0]:
        raise imp.unsupported(f"{op} batch of X {x.shape} and grid {grid.shape} differ",
                              fix="check the model")
    gf = grid if grid.dtype == x.dtype else g.op("cast", grid, to=x.dtype)
    dt = x.dtype

    def c(v: float) -> Tensor:
        return g.const(v, dt)

    # Per spatial dim: (index tensors, weight tensors or None for nearest, border bounds).
    per_dim: list[tuple[list[Tensor], list[Tensor] | None]] = []
    for i, d in enumerate(dims):
        k = nd - 1 - i  # the grid lists coordinates innermost dim first
        comp = g.op("slice", gf, starts=(k,), stops=(k + 1,), axes=(grid.rank - 1,), steps=(1,))
        comp = g.op("reshape", comp, shape=tuple(out_sp))
        pos = (comp + c(1.0)) / c(2.0) * c(d - 1) if align else ((comp + c(1.0)) * c(d) - c(1.0)) / c(2.0)
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        if mode == "nearest":
            pos = g.op("round", pos)  # half to even, as PyTorch and onnx's reference
        if pad_mode == "border":
            pos = g.op("where", g.op("logical_or", g.op("less", pos, c(lo)), g.op("greater", pos, c(hi))),
                       g.op("minimum", g.op("maximum", pos, c(0.0)), c(d - 1.0)), pos)
        elif pad_mode == "reflection":
            pos = _reflect(imp, pos, lo, hi)
        if mode == "nearest":
            per_dim.append(([pos], None))
            continue
        x0 = g.op("floor", pos)
        t = pos - x0
        if mode == "linear":
            per_dim.append(([x0, x0 + c(1.0)], [c(1.0) - t, t]))
        else:
            per_dim.append(([x0 - c(1.0), x0, x0 + c(1.0), x0 + c(2.0)], _cubic_w(imp, t)))
    # One flat table (N * prod(dims), C) and, per tap combination, a flat index and a validity mask.
    sp = math.prod(dims)
    table = g.op("reshape", g.op("transpose", x, perm=(0, *range(2, x.rank), 1)), shape=(nb * sp, c_))
    base = g.op("reshape", g.op("iota", shape=(nb,), axis=0, dtype=DType.I64) * g.const(sp, DType.I64),
                shape=(nb,) + (1,) * (len(out_sp) - 1))
    strides = [math.prod(dims[i + 1:]) for i in range(nd)]
    bounds = [((0.0, d - 1.0) if align else (-0.5, d - 0.5)) for d in dims]
    acc: Tensor | None = None
    for combo in itertools.product(*[range(len(p[0])) for p in per_dim]):
        flat: Tensor = base
        valid: Tensor | None = None
        weight: Tensor | None = None
        for i, j in enumerate(combo):
            idx_f = per_dim[i][0][j]
            d = dims[i]
            if pad_mode == "border":
                idx_f = g.op("minimum", g.op("maximum", idx_f, c(0.0)), c(d - 1.0))
            elif pad_mode == "reflection":
                idx_f = _reflect(imp, idx_f, *bounds[i])
            idx = g.op("cast", idx_f, to=DType.I64)  # truncation toward zero, as int() does
            if pad_mode == "zeros":
                ok = g.op("logical_and", g.op("greater_equal", idx_f, c(0.0)),
                          g.op("less", idx_f, c(float(d))))
                valid = ok if valid is None else g.op("logical_and", valid, ok)
                idx = g.op("minimum", g.op("maximum", idx, g.const(0, DType.I64)), g.const(d - 1, DType.I64))
            flat = flat + idx * g.const(strides[i], DType.I64)
            w = per_dim[i][1]
            if w is not None:
                weight = w[j] if weight is None else weight * w[j]
        v = g.op("gather", table, flat, axis=0)  # (N, *out, C)
        v = g.op("transpose", v, perm=(0, len(out_sp), *range(1, len(out_sp))))  # (N, C, *out)
        shp = (nb, 1, *out_sp[1:])
        if valid is not None:
            v = g.op("where", g.op("reshape", valid, shape=shp), v, c(0.0))
        if weight is not None:
            v = v * g.op("reshape", weight, shape=shp)
        acc = v if acc is None else acc + v
    assert acc is not None
    return [acc]


# ---------------------------------------------------------------------------------------------
# ConvTranspose

_onnx._OP_SINCE.update({"ConvTranspose": 1})


def _conv_transpose_pads(imp: _Importer, attrs: dict, in_hw: Sequence[int], kernel: Sequence[int],
                         strides: Sequence[int], dil: Sequence[int], out_pad: Sequence[int],
                         ) -> list[int]:
    """Pads (begins then ends) as onnx's reference resolves them from auto_pad / output_shape."""
    nd = len(in_hw)
    auto = str(attrs.get("auto_pad", "NOTSET"))
    out_shape = attrs.get("output_shape")
    if auto not in ("SAME_UPPER", "SAME_LOWER") and out_shape is None:
        given = attrs.get("pads")
        return [int(p) for p in given] if given is not None and auto == "NOTSET" else [0] * (2 * nd)
    # output_shape (or SAME's input*stride) fixes the total padding; as ONNX Runtime splits it.
    out_shape = [int(s) for s in (out_shape if out_shape is not None else
                                  [in_hw[i] * strides[i] for i in range(nd)])][-nd:]
    total = [strides[i] * (in_hw[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
             for i in range(nd)]
    if auto == "SAME_UPPER":
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    return [t - t // 2 for t in total] + [t // 2 for t in total]


@_handler("ConvTranspose")
def _conv_transpose(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """The transposed convolution as a direct one: the input with stride-1 zeros inserted between its
    elements, padded by (k-1)*dilation less the pads, convolved with the spatially flipped kernel whose
    in/out channels are swapped per group."""
    g = imp.g
    x = imp.t(ins[0])
    _float_input(imp, x, "ConvTranspose")
    nd = x.rank - 2
    w_val = ins[1]
    w_shape = tuple(w_val.array.shape) if isinstance(w_val, _Const) else imp.t(w_val).shape
    if nd not in (1, 2) or len(w_shape) != x.rank:
        raise imp.unsupported(f"ConvTranspose with {nd} spatial dims (input {x.shape}) is not supported",
                              fix="RLX translates 1-D and 2-D transposed convolutions (NCL / NCHW)")
    in_hw = _static(imp, x, range(2, x.rank), "ConvTranspose")
    kernel = [int(k) for k in attrs.get("kernel_shape", w_shape[2:])]
    if list(w_shape[2:]) != kernel:
        raise imp.unsupported(f"ConvTranspose kernel_shape {kernel} differs from the weight's "
                              f"{list(w_shape[2:])}",
                              fix="the model is malformed; export it again")
    strides = [int(s) for s in attrs.get("strides", [1] * nd)]
    dil = [int(d) for d in attrs.get("dilations", [1] * nd)]
    out_pad = [int(p) for p in attrs.get("output_padding", [0] * nd)]
    group = int(attrs.get("group", 1))
    pads = _conv_transpose_pads(imp, attrs, in_hw, kernel, strides, dil, out_pad)
    c_in, c_out_g = int(w_shape[0]), int(w_shape[1])
    if c_in != x.shape[1] or c_in % group:
        raise imp.unsupported(f"ConvTranspose weight {list(w_shape)} does not fit input channels "
                              f"{x.shape[1]} in {group} group(s)",
                              fix="the model is malformed; export it again")
    # The direct convolution's weight: (group, C_in/g, C_out/g, k...) -> (C_out, C_in/g, k...), flipped.
    wshape5 = (group, c_in // group, c_out_g, *kernel)
    perm = (0, 2, 1, *range(3, 3 + nd))
    flat = (group * c_out_g, c_in // group, *kernel)
    if isinstance(w_val, _Const):
        arr = w_val.array.astype(x.dtype.np).reshape(wshape5).transpose(perm).reshape(flat)
        w = imp.param(np.ascontiguousarray(arr[(Ellipsis,) + (slice(None, None, -1),) * nd]), None)
    else:
        w = g.op("transpose", g.op("reshape", imp.t(w_val, x.dtype), shape=wshape5), perm=perm)
        w = g.op("reshape", w, shape=flat)
        axes = tuple(range(2, 2 + nd))
        w = g.op("slice", w, starts=(-1,) * nd, stops=(-(2 ** 62),) * nd, axes=axes, steps=(-1,) * nd)
    # Zero insertion: (N, C, H, W) -> (N, C, H, 1, W, 1) -> padded to (N, C, H, s, W, s) -> (N, C, H*s, W*s);
    # the s-1 trailing zeros of each axis come off through the right padding below.
    n, c = x.shape[0], x.shape[1]
    if any(s > 1 for s in strides):
        inter = [n, c]
        for h in in_hw:
            inter += [h, 1]
        z = g.op("reshape", x, shape=tuple(inter))
        zpads = [0] * (2 * len(inter))
        for i, s in enumerate(strides):
            zpads[len(inter) + 3 + 2 * i] = s - 1
        z = g.op("pad", z, pads=tuple(zpads))
        z = g.op("reshape", z, shape=(n, c, *[h * s for h, s in zip(in_hw, strides)]))
    else:
        z = x
    before = [(k - 1) * d - p for k, d, p in zip(kernel, dil, pads[:nd])]
    after = [(k - 1) * d - p + op - (s - 1)
             for k, d, p, op, s in zip(kernel, dil, pads[nd:], out_pad, strides)]
    if any(b < 0 for b in before) or any(a < 0 for a in after):  # pads beyond the kernel crop the input
        sizes = [h * s for h, s in zip(in_hw, strides)]
        z = g.op("slice", z, starts=tuple(max(-b, 0) for b in before),
                 stops=tuple(sz - max(-a, 0) for sz, a in zip(sizes, after)),
                 axes=tuple(range(2, 2 + nd)), steps=(1,) * nd)
    zp = [max(b, 0) for b in before] + [max(a, 0) for a in after]
    if nd == 1:
        z = g.op("reshape", z, shape=(z.shape[0], z.shape[1], 1, z.shape[2]))
        w = g.op("reshape", w, shape=(w.shape[0], w.shape[1], 1, w.shape[2]))
        zp, dil2 = [0, zp[0], 0, zp[1]], [1, dil[0]]
    else:
        dil2 = list(dil)
    kw: dict[str, Any] = dict(strides=(1, 1), pads=tuple(zp), dilations=tuple(dil2), groups=group)
    b = ins[2] if len(ins) > 2 else None
    y = g.op("conv2d_bias", z, w, imp.t(b, x.dtype), **kw) if b is not None else g.op("conv2d", z, w, **kw)
    if nd == 1:
        y = g.op("reshape", y, shape=(y.shape[0], y.shape[1], y.shape[3]))
    return [y]


# ---------------------------------------------------------------------------------------------
# Small activations, hyperbolic/trigonometric functions and layout ops, written with existing ops

def _where_small(imp: _Importer, x: Tensor, small: Tensor, big: Tensor, bound: float = 0.1) -> Tensor:
    """``small`` (a series) where |x| < bound, else ``big``: closed forms like (e^x - e^-x)/2 lose
    every digit near 0 to cancellation, the series is exact to rounding there."""
    g = imp.g
    return g.op("where", g.op("less", g.op("abs", x), g.const(bound, x.dtype)), small, big)


def _unary_float(fn: Any) -> Any:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        x = imp.t(ins[0])
        _float_input(imp, x, node.op_type)
        return [fn(imp, x, attrs)]
    return h


def _k(imp: _Importer, v: float, x: Tensor) -> Tensor:
    return imp.g.const(v, x.dtype)


def _sinh(imp: _Importer, x: Tensor, attrs: dict) -> Tensor:
    g = imp.g
    x2 = x * x
    series = x * (_k(imp, 1.0, x) + x2 * (_k(imp, 1 / 6, x) + x2 * _k(imp, 1 / 120, x)))
    return _where_small(imp, x, series, (g.op("exp", x) - g.op("exp", g.op("neg", x))) * _k(imp, 0.5, x))


def _asinh(imp: _Importer, x: Tensor, attrs: dict) -> Tensor:
    g = imp.g
    a, x2 = g.op("abs", x), x * x
    big = g.op("sign", x) * g.op("log", a + g.op("sqrt", x2 + _k(imp, 1.0, x)))
    series = x * (_k(imp, 1.0, x) + x2 * (_k(imp, -1 / 6, x) + x2 * _k(imp, 3 / 40, x)))
    return _where_small(imp, x, series, big)


def _atanh(imp: _Importer, x: Tensor, attrs: dict) -> Tensor:
    g = imp.g
    one, x2 = _k(imp, 1.0, x), x * x
    big = g.op("log", (one + x) / (one - x)) * _k(imp, 0.5, x)
    series = x * (one + x2 * (_k(imp, 1 / 3, x) + x2 * _k(imp, 1 / 5, x)))
    return _where_small(imp, x, series, big)


_onnx._OP_REVIEWED.update({"Celu": 28, "SpaceToDepth": 28, "DepthToSpace": 28})

_SIMPLE_FLOAT: dict[str, Any] = {
    "Tan": lambda imp, x, a: imp.g.op("sin", x) / imp.g.op("cos", x),
    "Sinh": _sinh,
    "Cosh": lambda imp, x, a: (imp.g.op("exp", x) + imp.g.op("exp", imp.g.op("neg", x))) * _k(imp, 0.5, x),
    "Asinh": _asinh,
    "Acosh": lambda imp, x, a: imp.g.op("log", x + imp.g.op("sqrt", x * x - _k(imp, 1.0, x))),
    "Atanh": _atanh,
    "Swish": lambda imp, x, a: x * imp.g.op("sigmoid", x * _k(imp, float(a.get("alpha", 1.0)), x)),
    "ThresholdedRelu": lambda imp, x, a: imp.g.op(
        "where", imp.g.op("greater", x, _k(imp, float(a.get("alpha", 1.0)), x)), x, _k(imp, 0.0, x)),
}
for _name, _fn in _SIMPLE_FLOAT.items():
    _handler(_name)(_unary_float(_fn))


@_handler("Celu")
def _celu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "Celu")
    g, alpha = imp.g, float(attrs.get("alpha", 1.0))
    neg = (g.op("exp", x / _k(imp, alpha, x)) - _k(imp, 1.0, x)) * _k(imp, alpha, x)
    return [g.op("maximum", x, _k(imp, 0.0, x)) + g.op("minimum", neg, _k(imp, 0.0, x))]


@_handler("Shrink")
def _shrink(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "Shrink")
    g = imp.g
    bias, lambd = float(attrs.get("bias", 0.0)), float(attrs.get("lambd", 0.5))
    hi = g.op("where", g.op("greater", x, _k(imp, lambd, x)), x - _k(imp, bias, x), _k(imp, 0.0, x))
    return [g.op("where", g.op("less", x, _k(imp, -lambd, x)), x + _k(imp, bias, x), hi)]


@_handler("IsInf")
def _isinf(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "IsInf")
    g = imp.g
    pos = g.op("equal", x, _k(imp, math.inf, x))
    neg = g.op("equal", x, _k(imp, -math.inf, x))
    want = [t for t, on in ((pos, attrs.get("detect_positive", 1)), (neg, attrs.get("detect_negative", 1)))
            if int(on)]
    if not want:
        return [g.op("logical_and", pos, neg)]  # detects nothing: never both +inf and -inf
    return [want[0] if len(want) == 1 else g.op("logical_or", *want)]


def _block(imp: _Importer, x: Tensor, attrs: dict, op: str) -> tuple[int, int, int, int, int]:
    if x.rank != 4:
        raise imp.unsupported(f"{op} of a rank-{x.rank} input", fix=f"{op} takes NCHW input")
    n, c, h, w = _static(imp, x, range(4), op)
    b = int(attrs.get("blocksize", 0))
    if b <= 0:
        raise imp.unsupported(f"{op} blocksize {b}", fix="blocksize must be a positive integer")
    return n, c, h, w, b


@_handler("SpaceToDepth")
def _space_to_depth(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    n, c, h, w, b = _block(imp, x, attrs, "SpaceToDepth")
    if h % b or w % b:
        raise imp.unsupported(f"SpaceToDepth of {h}x{w} by blocksize {b}", fix="H and W must divide by it")
    mode = attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("DCR", "CRD"):
        raise imp.unsupported(f"SpaceToDepth mode {mode!r}", fix="use mode 'DCR' or 'CRD'")
    g = imp.g
    y = g.op("reshape", x, shape=(n, c, h // b, b, w // b, b))
    # The inverse of DepthToSpace: DCR puts the block offset outermost in the channels, CRD innermost.
    y = g.op("transpose", y, perm=(0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return [g.op("reshape", y, shape=(n, c * b * b, h // b, w // b))]


@_handler("DepthToSpace")
def _depth_to_space(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    n, c, h, w, b = _block(imp, x, attrs, "DepthToSpace")
    if c % (b * b):
        raise imp.unsupported(f"DepthToSpace of {c} channels by blocksize {b}",
                              fix="the channels must divide by blocksize**2")
    mode = attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    g = imp.g
    cb = c // (b * b)
    if mode == "DCR":
        y = g.op("transpose", g.op("reshape", x, shape=(n, b, b, cb, h, w)), perm=(0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = g.op("transpose", g.op("reshape", x, shape=(n, cb, b, b, h, w)), perm=(0, 1, 4, 2, 5, 3))
    else:
        raise imp.unsupported(f"DepthToSpace mode {mode!r}", fix="use mode 'DCR' or 'CRD'")
    return [g.op("reshape", y, shape=(n, c // (b * b), h * b, w * b))]


@_handler("LpNormalization")
def _lp_normalization(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "LpNormalization")
    g = imp.g
    axis, p = int(attrs.get("axis", -1)) % max(x.rank, 1), int(attrs.get("p", 2))
    if p == 1:
        norm = g.op("reduce_sum", g.op("abs", x), axes=(axis,), keepdims=True)
    elif p == 2:
        norm = g.op("sqrt", g.op("reduce_sum", x * x, axes=(axis,), keepdims=True))
    else:
        raise imp.unsupported(f"LpNormalization with p={p}", fix="p must be 1 or 2")
    # An all-zero slice has norm 0 and is defined to stay 0 (no 0/0).
    zero = _k(imp, 0.0, x)
    return [x / g.op("where", g.op("equal", norm, zero), _k(imp, 1.0, x), norm)]


@_handler("MeanVarianceNormalization")
def _mvn(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "MeanVarianceNormalization")
    g = imp.g
    axes = tuple(int(a) % x.rank for a in attrs.get("axes", [0, 2, 3]))
    # As ONNX's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9).
    mean = g.op("reduce_mean", x, axes=axes, keepdims=True)
    var = g.op("reduce_mean", x * x, axes=axes, keepdims=True) - mean * mean
    return [(x - mean) / (g.op("sqrt", var) + _k(imp, 1e-9, x))]


@_handler("LRN")
def _lrn(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "LRN")
    if x.rank < 3:
        raise imp.unsupported(f"LRN of a rank-{x.rank} input", fix="LRN takes (N, C, D1, ...) input")
    c = _static(imp, x, [1], "LRN")[0]
    size = int(attrs["size"]) if "size" in attrs else 0
    if size <= 0:
        raise imp.unsupported("LRN without a positive size", fix="the model is malformed; export it again")
    alpha, beta, bias = (float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)),
                         float(attrs.get("bias", 1.0)))
    g = imp.g
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x * x
    pads = [0] * (2 * x.rank)
    pads[1], pads[1 + x.rank] = lo, hi
    padded = g.op("pad", sq, pads=tuple(pads))
    total = None
    for i in range(size):  # the channel window, one shifted slice per tap
        part = g.op("slice", padded, starts=(i,), stops=(i + c,), axes=(1,), steps=(1,))
        total = part if total is None else total + part
    assert total is not None
    denom = g.op("pow", _k(imp, bias, x) + total * _k(imp, alpha / size, x), _k(imp, beta, x))
    return [x / denom]


@_handler("Hardmax")
def _hardmax(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    _float_input(imp, x, "Hardmax")
    if imp.opset < 13:
        raise imp.unsupported("Hardmax before opset 13 (over a flattened 2-D view) is not translated",
                              fix="convert the model to opset 13 or newer")
    g = imp.g
    axis = int(attrs.get("axis", -1)) % x.rank
    shape = tuple(_static(imp, x, range(x.rank), "Hardmax"))
    idx = g.op("argmax", x, axis=axis, keepdims=True)
    pos = g.op("iota", shape=shape, axis=axis, dtype=idx.dtype)
    return [g.op("cast", g.op("equal", pos, idx), to=x.dtype)]
