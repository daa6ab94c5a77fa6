"""The quantized op set: INT8 inference (TFLite/CMSIS-NN rules) and INT4 weight-only dequantization.

Every op has type inference, an exact NumPy reference (integers exactly, floats as documented) and a
decomposition into MIR, so any backend that runs the MIR integer ops (rlx-cpu does) runs them
``common_ir`` with bit-identical results; embedded backends claim them natively (rlx-cortexm).

Layouts: ``matmul_i8`` weights are ``(N, K)`` (output rows, like ``linear`` and TFLite's
FullyConnected); ``conv2d_i8`` and the pools work on **NHWC** activations with **OHWI** weights
(``(O, KH, KW, C / groups)``, CMSIS-NN's layout), so per-channel parameters broadcast along the
last axis. Activations are asymmetric int8 (``real = scale * (q - zero_point)``), weights symmetric.

| op | inputs | result |
|---|---|---|
| ``quantize`` | x f32 | i8 ``clamp(rint(x / scale) + zero_point)`` (IEEE f32 quotient, ties to even) |
| ``dequantize`` | x i8 | f32 ``(x - zero_point) * scale`` (one f32 rounding) |
| ``matmul_i8`` | x i8 ``[..., K]``, w i8 ``[N, K]``, bias i32 ``[N]`` | i32 ``(x - x_zp) @ w.T + bias`` |
| ``conv2d_i8`` | x i8 NHWC, w i8 OHWI, bias i32 ``[O]`` | i32 NHWC, zero padding of ``x - x_zero_point`` |
| ``requantize`` | acc i32, multiplier i32, shift i32 (broadcast to acc) | i8 (see :mod:`.fixedpoint`) |
| ``softmax_i8`` | x i8 | i8 with scale 1/256, zero point -128 (Q16 exp table) |
| ``max_pool2d_i8`` / ``avg_pool2d_i8`` | x i8 NHWC | i8 (same scale; avg rounds half away) |
| ``dequantize_int4`` | packed u8 ``[N, K/2]``, scales f32 ``[N, K/G]`` | f32 ``[N, K]`` |

Integer accumulators wrap modulo 2**32 (C with ``-fwrapv``); scales are used as float32 values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import DTypeError, IRError, ShapeError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.hir import linear_shape
from ..ir.schema import REGISTRY, AttrSpec, OpSchema, register_op
from ..ir.types import Attrs, Dim, TensorType, attr_ints, broadcast_shapes, normalize_axis
from . import fixedpoint as fx

I8, I32, I64, U8, F32, F64 = DType.I8, DType.I32, DType.I64, DType.U8, DType.F32, DType.F64

_registered: list[str] = []


def _register(schema: OpSchema) -> None:
    register_op(schema)
    _registered.append(schema.name)


def _attrs(op: str, attrs: Mapping[str, Any]) -> Attrs:
    return REGISTRY.get(op).check_attrs(attrs, f"decomposition of {op}")


def _want(op: str, t: TensorType, dt: DType, name: str) -> None:
    if t.dtype is not dt:
        raise DTypeError(f"{op}: {name} is {t.dtype}, expected {dt}",
                         fix=f"{op} takes {name} as {dt} (see rlx_core.quant.ops)")


def _scale(op: str, attrs: Attrs, name: str = "scale") -> float:
    s = float(attrs[name])  # type: ignore[arg-type]
    s32 = float(np.float32(s))
    if not (math.isfinite(s32) and s32 > 0.0):
        raise IRError(f"{op}: {name}={s!r} must be a positive float32", fix="use a scale > 0")
    return s32


def _int8_attr(op: str, attrs: Attrs, name: str) -> int:
    v = int(attrs[name])  # type: ignore[arg-type]
    if not -128 <= v <= 127:
        raise IRError(f"{op}: {name}={v} is outside the int8 range", fix="use a value in [-128, 127]")
    return v


def _static(d: Dim) -> int:
    return d if isinstance(d, int) else 1


def _numel(t: TensorType) -> float:
    return float(t.numel())


_ZP = AttrSpec("zero_point", "int", default=0, doc="the int8 value that represents real 0")
_SCALE = AttrSpec("scale", "float", doc="real value of one quantization step (used as float32)")


# -- quantize / dequantize ---------------------------------------------------------------------

def _infer_quantize(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _want("quantize", ts[0], F32, "x")
    _scale("quantize", attrs)
    _int8_attr("quantize", attrs, "zero_point")
    return [TensorType(I8, ts[0].shape)]


def _ref_quantize(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    q = fx.round_half_even_f32(xs[0], float(attrs["scale"])) + int(attrs["zero_point"])  # type: ignore[arg-type]
    with np.errstate(invalid="ignore"):
        return [np.clip(q, -128, 127).astype(np.int64)]


def _dec_quantize(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("quantize", attrs)
    x = ins[0]
    v = g.op("round", g.op("div", x, g.const(np.float32(_scale("quantize", a)), F32)))
    zp = int(a["zero_point"])  # type: ignore[arg-type]
    if zp:
        v = v + g.const(float(zp), F32)
    v = g.op("minimum", g.op("maximum", v, g.const(-128.0, F32)), g.const(127.0, F32))
    return [g.op("cast", v, to=I8)]


_register(OpSchema(
    "quantize", ("x",), _infer_quantize, _ref_quantize, level="hir", category="quant",
    dtypes=(F32,), elementwise=True, decompose=_dec_quantize, differentiable=False,
    attrs=(_SCALE, _ZP),
    doc="f32 -> i8: clamp(rint(x / scale) + zero_point, -128, 127); x / scale is the IEEE f32 "
        "quotient and rint rounds half to even; +-Inf saturate, NaN is undefined"))


def _infer_dequantize(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _want("dequantize", ts[0], I8, "x")
    _scale("dequantize", attrs)
    _int8_attr("dequantize", attrs, "zero_point")
    return [TensorType(F32, ts[0].shape)]


def _ref_dequantize(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(xs[0], np.int64) - int(attrs["zero_point"])  # type: ignore[arg-type]
    return [x.astype(np.float64) * float(np.float32(attrs["scale"]))]  # type: ignore[arg-type]


def _dec_dequantize(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("dequantize", attrs)
    x = g.op("cast", ins[0], to=I32)
    zp = int(a["zero_point"])  # type: ignore[arg-type]
    if zp:
        x = x - g.const(zp, I32)
    return [g.op("cast", x, to=F32) * g.const(np.float32(_scale("dequantize", a)), F32)]


_register(OpSchema(
    "dequantize", ("x",), _infer_dequantize, _ref_dequantize, level="hir", category="quant",
    dtypes=(I8,), elementwise=True, decompose=_dec_dequantize, differentiable=False,
    attrs=(_SCALE, _ZP),
    doc="i8 -> f32: (x - zero_point) * scale, one float32 rounding (exact integer difference)"))


# -- matmul_i8 ---------------------------------------------------------------------------------

_XZP = AttrSpec("x_zero_point", "int", default=0, doc="zero point of x, subtracted before the products")


def _infer_matmul_i8(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, w, b = ts
    for t, n, dt in ((x, "x", I8), (w, "w", I8), (b, "bias", I32)):
        _want("matmul_i8", t, dt, n)
    _int8_attr("matmul_i8", attrs, "x_zero_point")
    return [TensorType(I32, linear_shape("matmul_i8", x, w, b))]


def _ref_matmul_i8(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w, b = (np.asarray(a, np.int64) for a in xs)
    x = x - int(attrs["x_zero_point"])  # type: ignore[arg-type]
    return [fx.wrap_i32(np.matmul(x, w.T) + b)]


def _dec_matmul_i8(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("matmul_i8", attrs)
    x, w, b = ins
    x32 = g.op("cast", x, to=I32)
    zp = int(a["x_zero_point"])  # type: ignore[arg-type]
    if zp:
        x32 = x32 - g.const(zp, I32)
    wt = g.op("transpose", g.op("cast", w, to=I32), perm=(1, 0))
    return [g.op("matmul", x32, wt) + b]


def _flops_matmul_i8(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return 2.0 * _static(ins[0].shape[-1]) * _numel(outs[0])


_register(OpSchema(
    "matmul_i8", ("x", "w", "bias"), _infer_matmul_i8, _ref_matmul_i8, level="hir", category="quant",
    dtypes=(I8,), decompose=_dec_matmul_i8, differentiable=False, flops=_flops_matmul_i8,
    attrs=(_XZP,),
    doc="int8 fully connected: i32 = (x - x_zero_point) @ w.T + bias with x i8 [..., K], w i8 [N, K] "
        "(symmetric), bias i32 [N]; 32-bit accumulation wraps"))


# -- conv2d_i8 ---------------------------------------------------------------------------------

_CONV_ATTRS = (AttrSpec("strides", "ints", default=(1, 1)),
               AttrSpec("pads", "ints", default=(0, 0, 0, 0), doc="(top, left, bottom, right)"),
               AttrSpec("dilations", "ints", default=(1, 1)),
               AttrSpec("groups", "int", default=1, doc="C for a depthwise convolution"),
               _XZP)


def conv_geometry(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], int]:
    s, p, d = attr_ints(attrs, "strides"), attr_ints(attrs, "pads"), attr_ints(attrs, "dilations")
    if len(s) != 2 or len(p) != 4 or len(d) != 2 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ShapeError(f"conv2d_i8 strides {s}, pads {p}, dilations {d} are invalid",
                         fix="strides (sh, sw) >= 1, pads (top, left, bottom, right) >= 0, "
                             "dilations (dh, dw) >= 1")
    return (s[0], s[1]), (p[0], p[1], p[2], p[3]), (d[0], d[1]), int(attrs["groups"])  # type: ignore[arg-type]


def _infer_conv2d_i8(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, w, b = ts
    for t, name, dt in ((x, "x", I8), (w, "w", I8), (b, "bias", I32)):
        _want("conv2d_i8", t, dt, name)
    _int8_attr("conv2d_i8", attrs, "x_zero_point")
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"conv2d_i8 needs x NHWC and w OHWI (rank 4), got {x.shape} and {w.shape}",
                         fix="transpose NCHW activations with perm (0, 2, 3, 1) and OIHW weights with "
                             "(0, 2, 3, 1)")
    (sh, sw), (pt, pl, pb, pr), (dh, dw), g = conv_geometry(attrs)
    n, h, wd, c = x.shape
    o, kh, kw, cg = w.shape
    if g < 1 or (isinstance(c, int) and c % g) or (isinstance(o, int) and o % g):
        raise ShapeError(f"conv2d_i8 groups={g} must divide C={c} and O={o}", fix="pick a valid groups")
    if isinstance(c, int) and cg * g != c:
        raise ShapeError(f"conv2d_i8 weight has {cg} input channels per group, x has {c} channels and "
                         f"groups={g}", fix="w.shape[3] * groups must equal C")
    if b.shape != (o,):
        raise ShapeError(f"conv2d_i8: bias shape {b.shape} must be ({o},)", fix="one int32 bias per "
                         "output channel")
    if isinstance(h, str) or isinstance(wd, str):
        raise ShapeError("conv2d_i8 spatial dims must be static", fix="specialize the graph first")
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1  # type: ignore[operator]
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1  # type: ignore[operator]
    if ho < 1 or wo < 1:
        raise ShapeError(f"conv2d_i8 output would be {ho}x{wo}", fix="the kernel is larger than the "
                         "padded input; reduce dilation or add padding")
    return [TensorType(I32, (n, ho, wo, o))]


def _ref_conv2d_i8(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w, b = (np.asarray(a, np.int64) for a in xs)
    (sh, sw), (pt, pl, pb, pr), (dh, dw), g = conv_geometry(attrs)
    x = x - int(attrs["x_zero_point"])  # type: ignore[arg-type]
    o, kh, kw, cg = w.shape
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, hp, wp, c = xp.shape
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, ho, wo, o), np.int64)
    og = o // g
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw, :]
            tap = tap.reshape(n, ho, wo, g, cg)
            wt = w[:, i, j, :].reshape(g, og, cg)
            out += np.einsum("nhwgc,goc->nhwgo", tap, wt).reshape(n, ho, wo, o)
    return [fx.wrap_i32(out + b)]


def _dec_conv2d_i8(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("conv2d_i8", attrs)
    x, w, b = ins
    x32 = g.op("cast", x, to=I32)
    zp = int(a["x_zero_point"])  # type: ignore[arg-type]
    if zp:
        x32 = x32 - g.const(zp, I32)
    xc = g.op("transpose", x32, perm=(0, 3, 1, 2))
    wc = g.op("transpose", g.op("cast", w, to=I32), perm=(0, 3, 1, 2))
    y = g.op("conv2d", xc, wc, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
             groups=a["groups"])
    return [g.op("transpose", y, perm=(0, 2, 3, 1)) + b]


def _flops_conv2d_i8(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    _, kh, kw, cg = ins[1].shape
    return 2.0 * _static(kh) * _static(kw) * _static(cg) * _numel(outs[0])


_register(OpSchema(
    "conv2d_i8", ("x", "w", "bias"), _infer_conv2d_i8, _ref_conv2d_i8, level="hir", category="quant",
    dtypes=(I8,), decompose=_dec_conv2d_i8, differentiable=False, flops=_flops_conv2d_i8,
    attrs=_CONV_ATTRS,
    doc="int8 2-D convolution: x i8 NHWC, w i8 OHWI (O, KH, KW, C/groups), bias i32 [O] -> i32 NHWC; "
        "padding contributes 0 (it pads x - x_zero_point); groups=C is a depthwise convolution"))


# -- requantize --------------------------------------------------------------------------------

_REQ_ATTRS = (AttrSpec("zero_point", "int", default=0, doc="output zero point"),
              AttrSpec("act_min", "int", default=-128, doc="clamp low (zero_point for a fused ReLU)"),
              AttrSpec("act_max", "int", default=127, doc="clamp high"))


def _infer_requantize(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, m, s = ts
    for t, n in ((x, "x"), (m, "multiplier"), (s, "shift")):
        _want("requantize", t, I32, n)
    lo = _int8_attr("requantize", attrs, "act_min")
    hi = _int8_attr("requantize", attrs, "act_max")
    _int8_attr("requantize", attrs, "zero_point")
    if lo > hi:
        raise IRError(f"requantize: act_min {lo} > act_max {hi}", fix="act_min <= act_max")
    out = broadcast_shapes(x.shape, m.shape, s.shape, where="requantize")
    if out != x.shape:
        raise ShapeError(f"requantize: multiplier {m.shape} and shift {s.shape} must broadcast to the "
                         f"accumulator {x.shape}", fix="give a scalar, per-channel (C,) or full shape")
    return [TensorType(I8, x.shape)]


def _ref_requantize(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, m, s = xs
    return [fx.requantize_reference(x, m, s, int(attrs["zero_point"]), int(attrs["act_min"]),  # type: ignore[arg-type]
                                    int(attrs["act_max"]))]  # type: ignore[arg-type]


def _pow2(g: GraphBuilder, e: Tensor) -> Tensor:
    """2**e for int64 e in [0, 62], exactly (f64 pow of 2.0 is exact)."""
    return g.op("cast", g.op("pow", g.const(2.0, F64), g.op("cast", e, to=F64)), to=I64)


def _dec_requantize(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("requantize", attrs)
    x, m, s = (g.op("cast", t, to=I64) for t in ins)
    zero = g.const(0, I64)
    p_left = _pow2(g, g.op("maximum", s, zero))
    p_right = _pow2(g, g.op("maximum", g.op("neg", s), zero))
    # x * 2**left in int32 (wrapping), then SaturatingRoundingDoublingHighMul in int64.
    shifted = g.op("cast", g.op("cast", x * p_left, to=I32), to=I64)
    ab = shifted * m
    nudge = g.op("where", g.op("greater_equal", ab, zero), g.const(1 << 30, I64), g.const(1 - (1 << 30), I64))
    high = g.op("div", ab + nudge, g.const(1 << 31, I64))
    high = g.op("minimum", high, g.const(fx.INT32_MAX, I64))  # only INT32_MIN * INT32_MIN exceeds
    # RoundingDivideByPOT: round half away from zero = sign(v) * ((|v| + 2**e / 2) / 2**e).
    half = g.op("div", p_right, g.const(2, I64))
    r = g.op("sign", high) * g.op("div", g.op("abs", high) + half, p_right)
    y = g.op("cast", r, to=I32)
    zp = int(a["zero_point"])  # type: ignore[arg-type]
    if zp:
        y = y + g.const(zp, I32)
    y = g.op("minimum", g.op("maximum", y, g.const(int(a["act_min"]), I32)),  # type: ignore[arg-type]
             g.const(int(a["act_max"]), I32))  # type: ignore[arg-type]
    return [g.op("cast", y, to=I8)]


_register(OpSchema(
    "requantize", ("x", "multiplier", "shift"), _infer_requantize, _ref_requantize, level="hir",
    category="quant", dtypes=(I32,), decompose=_dec_requantize, differentiable=False,
    attrs=_REQ_ATTRS, flops=lambda i, o, a: 6.0 * _numel(o[0]),
    doc="i32 -> i8: clamp(MultiplyByQuantizedMultiplier(x, multiplier, shift) + zero_point, act_min, "
        "act_max), the TFLite/CMSIS-NN rule (SaturatingRoundingDoublingHighMul then "
        "RoundingDivideByPOT); multiplier and shift (in [-31, 31], positive = left) broadcast to x"))


# -- softmax_i8 --------------------------------------------------------------------------------

def _infer_softmax_i8(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    _want("softmax_i8", x, I8, "x")
    _scale("softmax_i8", attrs)
    if x.rank < 1:
        raise ShapeError("softmax_i8 of a scalar", fix="reshape to [1]")
    ax = normalize_axis(int(attrs["axis"]), x.rank)  # type: ignore[arg-type]
    n = x.shape[ax]
    if isinstance(n, str) or not 1 <= n <= fx.SOFTMAX_MAX_ROW:
        raise ShapeError(f"softmax_i8 axis has size {n}", fix=f"the softmax axis must be static, in "
                         f"[1, {fx.SOFTMAX_MAX_ROW}]")
    return [x]


def _ref_softmax_i8(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    return [fx.softmax_i8_reference(x, float(attrs["scale"]), float(attrs["beta"]), ax)]  # type: ignore[arg-type]


def _dec_softmax_i8(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("softmax_i8", attrs)
    x32 = g.op("cast", ins[0], to=I32)
    ax = (normalize_axis(int(a["axis"]), x32.rank),)  # type: ignore[arg-type]
    d = g.op("reduce_max", x32, axes=ax, keepdims=True) - x32
    lut = g.const(fx.softmax_lut(float(a["scale"]), float(a["beta"])), I32)  # type: ignore[arg-type]
    e = g.op("gather", lut, d, axis=0)
    s = g.op("reduce_sum", e, axes=ax, keepdims=True)
    q = g.op("div", e * g.const(256, I32) + g.op("div", s, g.const(2, I32)), s)
    y = g.op("minimum", q - g.const(128, I32), g.const(127, I32))
    return [g.op("cast", y, to=I8)]


_register(OpSchema(
    "softmax_i8", ("x",), _infer_softmax_i8, _ref_softmax_i8, level="hir", category="quant",
    dtypes=(I8,), decompose=_dec_softmax_i8, differentiable=False,
    flops=lambda i, o, a: 5.0 * _numel(o[0]),
    attrs=(_SCALE, AttrSpec("beta", "float", default=1.0), AttrSpec("axis", "int", default=-1)),
    doc="int8 softmax along axis: e = LUT[max - x] with LUT[d] = round(2**16 exp(-beta scale d)), "
        "y = clamp(floor((256 e + sum(e)/2) / sum(e)) - 128, -128, 127): probabilities with scale "
        "1/256 and zero point -128"))


# -- pooling (NHWC) ----------------------------------------------------------------------------

_POOL_ATTRS = (AttrSpec("kernel", "ints", doc="(kh, kw)"),
               AttrSpec("strides", "ints", default=None, doc="(sh, sw); None means the kernel size"),
               AttrSpec("pads", "ints", default=(0, 0, 0, 0),
                        doc="(top, left, bottom, right), each smaller than the kernel"))


def pool_geometry(op: str, attrs: Attrs
                  ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    k = attr_ints(attrs, "kernel")
    s = attr_ints(attrs, "strides") if attrs["strides"] is not None else k
    p = attr_ints(attrs, "pads")
    if len(k) != 2 or min(k) < 1 or len(s) != 2 or min(s) < 1 or len(p) != 4 or min(p) < 0:
        raise ShapeError(f"{op}: kernel {k}, strides {s}, pads {p} are invalid",
                         fix="kernel (kh, kw) >= 1, strides (sh, sw) >= 1, pads (t, l, b, r) >= 0")
    if max(p[0], p[2]) >= k[0] or max(p[1], p[3]) >= k[1]:
        raise ShapeError(f"{op}: pads {p} must be smaller than the kernel {k} on each side",
                         fix="reduce the padding")
    return (k[0], k[1]), (s[0], s[1]), (p[0], p[1], p[2], p[3])


def _pool_out(op: str, x: TensorType, attrs: Attrs) -> tuple[int, int]:
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = pool_geometry(op, attrs)
    h, w = x.shape[1], x.shape[2]
    if isinstance(h, str) or isinstance(w, str):
        raise ShapeError(f"{op}: spatial dims ({h}, {w}) must be static", fix="specialize the graph first")
    ho = (h + pt + pb - kh) // sh + 1
    wo = (w + pl + pr - kw) // sw + 1
    if ho < 1 or wo < 1:
        raise ShapeError(f"{op}: output would be {ho}x{wo}", fix="shrink the kernel or pad more")
    return ho, wo


def _infer_pool(op: str) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        x = ts[0]
        _want(op, x, I8, "x")
        if x.rank != 4:
            raise ShapeError(f"{op}: x must be NHWC (rank 4), got {x.shape}", fix="reshape to 4-D")
        ho, wo = _pool_out(op, x, attrs)
        return [TensorType(I8, (x.shape[0], ho, wo, x.shape[3]))]
    return infer


def _taps_np(x: np.ndarray, op: str, attrs: Attrs, fill: int) -> tuple[list[np.ndarray], tuple[int, int]]:
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = pool_geometry(op, attrs)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    taps = [xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw, :]
            for i in range(kh) for j in range(kw)]
    return taps, (ho, wo)


def _ref_max_pool_i8(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    taps, _ = _taps_np(np.asarray(xs[0], np.int64), "max_pool2d_i8", attrs, -128)
    return [np.maximum.reduce(taps)]


def pool_counts(x_shape: Sequence[int], attrs: Attrs) -> np.ndarray:
    """Unpadded elements per window of ``avg_pool2d_i8``: int64 ``(1, Ho, Wo, 1)``."""
    ones = np.ones((1, int(x_shape[1]), int(x_shape[2]), 1), np.int64)
    taps, _ = _taps_np(ones, "avg_pool2d_i8", attrs, 0)
    return np.add.reduce(taps)


def _ref_avg_pool_i8(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(xs[0], np.int64)
    taps, _ = _taps_np(x, "avg_pool2d_i8", attrs, 0)
    total = np.add.reduce(taps)
    count = pool_counts(x.shape, attrs)
    half = count // 2
    return [fx.trunc_div(np.where(total > 0, total + half, total - half), count)]


def _slices(g: GraphBuilder, x: Tensor, op: str, a: Attrs, fill: float) -> list[Tensor]:
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = pool_geometry(op, a)
    ho, wo = _pool_out(op, x.type, a)
    if any((pt, pl, pb, pr)):
        x = g.op("pad", x, pads=(0, pt, pl, 0, 0, pb, pr, 0), value=fill)
    return [g.op("slice", x, starts=(i, j), stops=(i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1),
                 axes=(1, 2), steps=(sh, sw)) for i in range(kh) for j in range(kw)]


def _dec_max_pool_i8(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("max_pool2d_i8", attrs)
    taps = _slices(g, ins[0], "max_pool2d_i8", a, -128.0)
    y = taps[0]
    for t in taps[1:]:
        y = g.op("maximum", y, t)
    return [y]


def _dec_avg_pool_i8(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("avg_pool2d_i8", attrs)
    x = g.op("cast", ins[0], to=I32)
    taps = _slices(g, x, "avg_pool2d_i8", a, 0.0)
    total = taps[0]
    for t in taps[1:]:
        total = total + t
    count = pool_counts(ins[0].shape, a)  # type: ignore[arg-type]
    num = g.op("where", g.op("greater", total, g.const(0, I32)), total + g.const(count // 2, I32),
               total - g.const(count // 2, I32))
    return [g.op("cast", g.op("div", num, g.const(count, I32)), to=I8)]


def _flops_pool(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    kh, kw = attr_ints(attrs, "kernel")
    return float(kh * kw) * _numel(outs[0])


_register(OpSchema(
    "max_pool2d_i8", ("x",), _infer_pool("max_pool2d_i8"), _ref_max_pool_i8, level="hir",
    category="quant", dtypes=(I8,), decompose=_dec_max_pool_i8, differentiable=False,
    flops=_flops_pool, attrs=_POOL_ATTRS,
    doc="int8 max pooling over NHWC (scale and zero point unchanged); padding never wins"))

_register(OpSchema(
    "avg_pool2d_i8", ("x",), _infer_pool("avg_pool2d_i8"), _ref_avg_pool_i8, level="hir",
    category="quant", dtypes=(I8,), decompose=_dec_avg_pool_i8, differentiable=False,
    flops=_flops_pool, attrs=_POOL_ATTRS,
    doc="int8 average pooling over NHWC: the window sum of unpadded elements divided by their count, "
        "rounded half away from zero (TFLite/CMSIS-NN); scale and zero point unchanged"))


# -- INT4 weight-only --------------------------------------------------------------------------

def _infer_dequantize_int4(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    p, s = ts
    _want("dequantize_int4", p, U8, "packed")
    _want("dequantize_int4", s, F32, "scales")
    gs = int(attrs["group_size"])  # type: ignore[arg-type]
    if p.rank != 2 or s.rank != 2 or not all(isinstance(d, int) for d in (*p.shape, *s.shape)):
        raise ShapeError(f"dequantize_int4: packed {p.shape} and scales {s.shape} must be static 2-D",
                         fix="packed is (N, K/2) bytes, scales (N, K/group_size)")
    n, k2 = int(p.shape[0]), int(p.shape[1])  # static: checked above
    k = 2 * k2
    if gs < 1 or k % gs or s.shape != (n, k // gs):
        raise ShapeError(f"dequantize_int4: {k} columns in groups of {gs} need scales "
                         f"({n}, {k // max(gs, 1)}), got {s.shape}",
                         fix="group_size must divide K; one scale per row and group")
    return [TensorType(F32, (n, k))]


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """(N, K/2) bytes -> (N, K) int64 in [-8, 7]: element 2j is the low nibble of byte j."""
    p = np.asarray(packed).astype(np.int64)
    nib = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], 2 * p.shape[1])
    return np.where(nib >= 8, nib - 16, nib)


def _ref_dequantize_int4(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    p, s = xs
    q = unpack_int4(p).astype(np.float64)
    gs = int(attrs["group_size"])  # type: ignore[arg-type]
    scales = np.repeat(np.asarray(s, np.float64), gs, axis=1)
    return [q * scales]


def _dec_dequantize_int4(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("dequantize_int4", attrs)
    p, s = ins
    n, k2 = int(p.shape[0]), int(p.shape[1])  # static: its inference has checked
    gs = int(a["group_size"])  # type: ignore[arg-type]
    p32 = g.op("cast", p, to=I32)
    hi = g.op("div", p32, g.const(16, I32))
    lo = p32 - hi * g.const(16, I32)

    def signed(v: Tensor) -> Tensor:
        return g.op("where", g.op("greater_equal", v, g.const(8, I32)), v - g.const(16, I32), v)

    pair = g.op("concat", g.op("reshape", signed(lo), shape=(n, k2, 1)),
                g.op("reshape", signed(hi), shape=(n, k2, 1)), axis=2)
    k = 2 * k2
    q = g.op("reshape", g.op("cast", pair, to=F32), shape=(n, k // gs, gs))
    w = q * g.op("reshape", s, shape=(n, k // gs, 1))
    return [g.op("reshape", w, shape=(n, k))]


_register(OpSchema(
    "dequantize_int4", ("packed", "scales"), _infer_dequantize_int4, _ref_dequantize_int4, level="hir",
    category="quant", dtypes=(U8,), decompose=_dec_dequantize_int4, differentiable=False,
    flops=lambda i, o, a: 2.0 * _numel(o[0]),
    attrs=(AttrSpec("group_size", "int", doc="columns sharing one scale; divides K"),),
    doc="INT4 weight-only: (N, K/2) packed bytes (low nibble first, two's complement [-8, 7]) times "
        "one f32 scale per row and group of group_size columns -> f32 (N, K)"))


#: The ops this module registers, in registration order.
QUANT_OPS: tuple[str, ...] = tuple(_registered)
