"""ONNX's quantized operators, translated into existing RLX IR ops (issue 17).

QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul
and QLinearConv. Each is the arithmetic onnx's reference (and ONNX Runtime) defines, written with
RLX's elementwise ops, ``matmul`` and ``conv2d`` on int32: integer products accumulate exactly in
int32, scales are applied in float32, rounding is half-to-even (``round``) and saturation a clip
before the cast. So every backend runs them, and a QDQ model whose weights are constants folds its
DequantizeLinear nodes into float weights at import.

Scales and zero points may be scalars, per-axis vectors (``axis``) or, from opset 21, blocks
(``block_size``): each is broadcast to the input's shape here, with constants shaped at import.
QuantizeLinear/DequantizeLinear also take RLX's low-precision storage types (rlx_core.dtypes.LOWP_DTYPES):
int4/uint4/int2/uint2 saturate like the 8-bit integers; float8 outputs are ``x / scale`` cast with
ONNX's ``saturate`` (no rounding to integers, no zero point), float4 adds its zero point and casts;
dequantizing a float8/float4 ignores its zero point (which must be 0), as onnx's reference does.
Quantized types RLX does not have (float6, float8e8m0) are refused by dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from . import onnx as _onnx
from .onnx import _Const, _handler, _Importer, cast_onnx

#: Saturation ranges of the quantized integer types RLX has.
_QRANGE: dict[DType, tuple[int, int]] = {DType.U8: (0, 255), DType.I8: (-128, 127),
                                         DType.I16: (-32768, 32767), DType.U16: (0, 65535),
                                         DType.I4: (-8, 7), DType.U4: (0, 15), DType.I2: (-2, 1),
                                         DType.U2: (0, 3)}
#: The quantized float types: ``x / scale`` is cast to them, not rounded to an integer grid.
_QFLOATS = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ, DType.F4E2M1})
#: ONNX TensorProto data types of QuantizeLinear's ``output_dtype`` that RLX has.
_ONNX_QTYPES: dict[int, DType] = {2: DType.U8, 3: DType.I8, 5: DType.I16, 4: DType.U16, 17: DType.F8E4M3FN,
                                  18: DType.F8E4M3FNUZ, 19: DType.F8E5M2, 20: DType.F8E5M2FNUZ, 21: DType.U4,
                                  22: DType.I4, 23: DType.F4E2M1, 25: DType.U2, 26: DType.I2}
_QNAMES = ("uint8, int8, int16, uint16, int4, uint4, int2, uint2, float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), "
           "float4e2m1")

_onnx._OP_SINCE.update({"QuantizeLinear": 10, "DequantizeLinear": 10, "DynamicQuantizeLinear": 11,
                        "MatMulInteger": 10, "ConvInteger": 10, "QLinearMatMul": 10, "QLinearConv": 10})
# -19..-28 add float8/int4/float4/float6 types (refused by dtype), ``block_size``, ``output_dtype`` and
# ``precision`` (translated, or refused below).
_onnx._OP_REVIEWED.update({"QuantizeLinear": 28, "DequantizeLinear": 28, "QLinearMatMul": 21})


def _as(imp: _Importer, v: Any, dt: DType) -> Tensor:
    """The value as a tensor of ``dt`` (constants converted at import, tensors cast)."""
    t = imp.t(v, dt)
    return t if t.dtype == dt else imp.g.op("cast", t, to=dt)


def _numel(imp: _Importer, v: Any) -> int:
    shape = v.array.shape if isinstance(v, _Const) else imp.t(v).shape
    if not all(isinstance(d, int) for d in shape):
        raise imp.symbolic(f"a quantization parameter of symbolic shape {tuple(shape)}")
    return math.prod(int(d) for d in shape)


def _dtype(imp: _Importer, v: Any) -> DType:
    return DType.parse(v.array.dtype) if isinstance(v, _Const) else imp.t(v).dtype


def _broadcast_param(imp: _Importer, v: Any, x: Tensor, axis: int, block: int, what: str,
                     dtype: DType) -> Tensor:
    """A scale or zero point shaped to broadcast against ``x``: a scalar as it is, a 1-D per-axis
    vector along ``axis``, a blocked tensor repeated ``block`` times along ``axis``."""
    rank = x.rank
    ax = axis % rank if rank else 0
    shape = tuple(v.array.shape) if isinstance(v, _Const) else imp.t(v).shape
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1 and block == 0):
        return imp.g.op("reshape", _as(imp, v, dtype), shape=())
    if block == 0:
        if len(shape) != 1 or shape[0] != x.shape[ax]:
            raise imp.unsupported(f"{what} of shape {list(shape)} does not match axis {axis} of the input "
                                  f"{list(x.shape)}",
                                  fix="give a scalar or one value per element of that axis")
        target = [1] * rank
        target[ax] = int(shape[0])
        return imp.g.op("reshape", _as(imp, v, dtype), shape=tuple(target))
    if len(shape) != rank:
        raise imp.unsupported(f"{what} of shape {list(shape)} for block quantization of a rank-{rank} input",
                              fix="block quantization needs a scale of the input's rank")
    size = x.shape[ax]
    if not isinstance(size, int):
        raise imp.symbolic(f"{what}: block quantization along a symbolic axis")
    if isinstance(v, _Const):
        arr = np.repeat(v.array, block, axis=ax)
        arr = np.take(arr, np.arange(size), axis=ax)
        return _as(imp, _Const(np.ascontiguousarray(arr)), dtype)
    t = _as(imp, v, dtype)
    n = shape[ax]
    wide = list(shape[:ax + 1]) + [1] + list(shape[ax + 1:])
    t = imp.g.op("reshape", t, shape=tuple(wide))
    wide[ax + 1] = block
    t = imp.g.op("expand", t, shape=tuple(wide))
    flat = list(shape)
    flat[ax] = n * block
    t = imp.g.op("reshape", t, shape=tuple(flat))
    if n * block != size:
        t = imp.g.op("slice", t, starts=(0,), stops=(size,), axes=(ax,), steps=(1,))
    return t


def _saturate(imp: _Importer, y: Tensor, qt: DType) -> Tensor:
    """round half to even, clip to ``qt``'s range, cast (``y`` is float)."""
    lo, hi = _QRANGE[qt]
    g = imp.g
    y = g.op("round", y)
    y = g.op("minimum", g.op("maximum", y, g.const(float(lo), y.dtype)), g.const(float(hi), y.dtype))
    return g.op("cast", y, to=qt)


def _qtype(imp: _Importer, dt: DType, what: str) -> DType:
    if dt not in _QRANGE and dt not in _QFLOATS:
        raise imp.unsupported(f"{what} has dtype {dt.value}, which is not a quantized type RLX translates",
                              fix=f"quantize to {_QNAMES}")
    return dt


def _unread_zero_point(imp: _Importer, zp: Any, qt: DType) -> None:
    """A float8 zero point (and float4's in DequantizeLinear) is not read, as in onnx's reference; the
    spec requires it to be 0, so a constant one that is not is refused rather than ignored."""
    if isinstance(zp, _Const) and np.any(zp.array.astype(np.float32) != 0):
        raise imp.unsupported(f"a {qt.value} zero point that is not 0",
                              fix="float8 (and float4, when dequantizing) zero points must be 0: drop it "
                                  "or fold it into the values")


def _float32(imp: _Importer, x: Tensor) -> Tensor:
    return x if x.dtype in (DType.F32, DType.F64) else imp.g.op("cast", x, to=DType.F32)


@_handler("QuantizeLinear")
def _quantize_linear(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if not (x.dtype.is_float or x.dtype is DType.I32):
        raise imp.unsupported(f"QuantizeLinear of a {x.dtype.value} input",
                              fix="quantize a float or int32 tensor")
    zp = ins[2] if len(ins) > 2 else None
    if int(attrs.get("precision", 0) or 0) not in (0, 1):
        raise imp.unsupported("QuantizeLinear with a precision other than float32 is not translated",
                              fix="export without the precision attribute")
    if zp is not None:
        qt = _qtype(imp, _dtype(imp, zp), "the zero point")
    else:
        code = int(attrs.get("output_dtype", 0) or 2)
        if code not in _ONNX_QTYPES:
            raise imp.unsupported(f"QuantizeLinear to ONNX type {_onnx._onnx_type_name(code)} is not "
                                  f"translated",
                                  fix=f"quantize to {_QNAMES}")
        qt = _ONNX_QTYPES[code]
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0) or 0)
    scale_dt = _dtype(imp, ins[1])
    # onnx's reference divides in the scale's precision (float32 for float16 scales too, as ONNX
    # Runtime's kernels do): compute in float32, or float64 for a float64 input.
    # (NumPy's promotion: an int32 input divides in float64.)
    ct = DType.F64 if DType.F64 in (x.dtype, scale_dt) or x.dtype is DType.I32 else DType.F32
    xf = x if x.dtype == ct else imp.g.op("cast", x, to=ct)
    y = xf / _broadcast_param(imp, ins[1], x, axis, block, "the scale", ct)
    if x.dtype == scale_dt and scale_dt in (DType.F16, DType.BF16):
        # Both half precision: the reference's quotient is rounded to it before rounding to integers.
        y = imp.g.op("cast", imp.g.op("cast", y, to=scale_dt), to=ct)
    if qt in _QFLOATS:
        # onnx's reference: float8 casts x / scale with ``saturate`` and ignores the zero point (the
        # spec requires 0); float4 adds the zero point and casts (it always saturates).
        if qt is DType.F4E2M1 and zp is not None:
            y = y + _broadcast_param(imp, zp, x, axis, block, "the zero point", ct)
        elif zp is not None:
            _unread_zero_point(imp, zp, qt)
        saturate = int(attrs.get("saturate", 1))
        if saturate not in (0, 1):
            raise imp.unsupported(f"saturate={saturate}", fix="saturate is 0 or 1 (the model is malformed)")
        return [cast_onnx(imp, y, qt, bool(saturate))]
    y = imp.g.op("round", y)
    if zp is not None:
        y = y + _broadcast_param(imp, zp, x, axis, block, "the zero point", ct)
    return [_saturate(imp, y, qt)]


@_handler("DequantizeLinear")
def _dequantize_linear(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if x.dtype not in _QRANGE and x.dtype not in _QFLOATS and x.dtype is not DType.I32:
        raise imp.unsupported(f"DequantizeLinear of a {x.dtype.value} input",
                              fix=f"dequantize {_QNAMES} or int32")
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0) or 0)
    out_dt = _dtype(imp, ins[1])
    if int(attrs.get("output_dtype", 0) or 0):
        code = int(attrs["output_dtype"])
        want = {1: DType.F32, 10: DType.F16, 16: DType.BF16, 11: DType.F64}.get(code)
        if want is None:
            raise imp.unsupported(f"DequantizeLinear to ONNX type {code} is not translated",
                                  fix="dequantize to float32, float16, bfloat16 or float64")
        out_dt = want
    if not out_dt.is_float:
        raise imp.unsupported(f"DequantizeLinear with a {out_dt.value} scale", fix="the scale must be float")
    ct = DType.F64 if out_dt is DType.F64 else DType.F32
    g = imp.g
    zp = ins[2] if len(ins) > 2 else None
    if x.dtype in _QFLOATS:
        # onnx's reference ignores a float zero point (float8's must be 0; float4's is not read).
        if zp is not None:
            _unread_zero_point(imp, zp, x.dtype)
        zp = None
    if zp is not None:
        d = g.op("cast", x, to=DType.I32) - _broadcast_param(imp, zp, x, axis, block, "the zero point",
                                                             DType.I32)
        y = g.op("cast", d, to=ct)
    else:
        y = g.op("cast", x, to=ct)
    y = y * _broadcast_param(imp, ins[1], x, axis, block, "the scale", ct)
    return [y if out_dt == ct else g.op("cast", y, to=out_dt)]


@_handler("DynamicQuantizeLinear")
def _dynamic_quantize_linear(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = _float32(imp, imp.t(ins[0]))
    g = imp.g
    axes = tuple(range(x.rank))
    zero = g.const(0.0, x.dtype)
    hi = g.op("maximum", g.op("reduce_max", x, axes=axes, keepdims=False), zero)
    lo = g.op("minimum", g.op("reduce_min", x, axes=axes, keepdims=False), zero)
    span = hi - lo
    span = g.op("where", g.op("equal", span, zero), g.const(1.0, x.dtype), span)
    scale = span / g.const(255.0, x.dtype)
    zpf = g.op("minimum", g.op("maximum", zero - lo / scale, zero), g.const(255.0, x.dtype))
    zpf = g.op("round", zpf)
    y = _saturate(imp, g.op("round", x / scale) + zpf, DType.U8)
    return [y, scale, g.op("cast", zpf, to=DType.U8)]


def _centered(imp: _Importer, v: Any, zp: Any, zp_shape: tuple[int, ...] | None) -> Tensor:
    """``v - zp`` in int32 (``zp_shape``: how a non-scalar zero point broadcasts)."""
    t = imp.g.op("cast", imp.t(v), to=DType.I32)
    if zp is None:
        return t
    z = _as(imp, zp, DType.I32)
    if z.rank and zp_shape is not None:
        z = imp.g.op("reshape", z, shape=zp_shape)
    return t - z


def _matmul_zp_shapes(imp: _Importer, a: Tensor, b: Tensor, azp: Any, bzp: Any,
                      ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """A per-row A zero point broadcasts along A's rows, a per-column B zero point along B's columns."""
    a_shape = (int(a.shape[-2]), 1) if azp is not None and _numel(imp, azp) > 1 else None
    b_shape = (1, int(b.shape[-1])) if bzp is not None and _numel(imp, bzp) > 1 else None
    return a_shape, b_shape


@_handler("MatMulInteger")
def _matmul_integer(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    a, b = imp.t(ins[0]), imp.t(ins[1])
    azp = ins[2] if len(ins) > 2 else None
    bzp = ins[3] if len(ins) > 3 else None
    ash, bsh = _matmul_zp_shapes(imp, a, b, azp, bzp)
    return [imp.g.op("matmul", _centered(imp, a, azp, ash), _centered(imp, b, bzp, bsh))]


def _conv_int(imp: _Importer, x: Any, w: Any, xzp: Any, wzp: Any, attrs: dict) -> Tensor:
    xt, wt = imp.t(x), imp.t(w)
    wsh = (int(wt.shape[0]),) + (1,) * (wt.rank - 1)
    xi = _centered(imp, xt, xzp, None)
    wzp_size = _numel(imp, wzp) if wzp is not None else 0
    wi = _centered(imp, wt, wzp, wsh if wzp_size > 1 else None)
    return _onnx._conv(imp, None, [xi, wi], attrs)[0]


@_handler("ConvInteger")
def _conv_integer(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return [_conv_int(imp, ins[0], ins[1], ins[2] if len(ins) > 2 else None,
                      ins[3] if len(ins) > 3 else None, attrs)]


def _requantize(imp: _Importer, acc: Tensor, scale: Tensor, yzp: Any, qt: DType,
                zp_shape: tuple[int, ...] | None = None) -> Tensor:
    g = imp.g
    y = g.op("cast", acc, to=scale.dtype) * scale
    if yzp is not None:
        z = _as(imp, yzp, scale.dtype)
        y = y + (g.op("reshape", z, shape=zp_shape) if z.rank and zp_shape is not None else z)
    return _saturate(imp, y, qt)


@_handler("QLinearMatMul")
def _qlinear_matmul(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    a, a_scale, azp, b, b_scale, bzp, y_scale, yzp = (list(ins) + [None] * 8)[:8]
    at, bt = imp.t(a), imp.t(b)
    ash, bsh = _matmul_zp_shapes(imp, at, bt, azp, bzp)
    acc = imp.g.op("matmul", _centered(imp, at, azp, ash), _centered(imp, bt, bzp, bsh))
    # The reference forms a_scale * b_scale / y_scale in the scales' float32, then multiplies the
    # int32 products by it in float64 (NumPy promotes int32 by float32): so does this, rounding once.
    def f32(v: Any, shape: tuple[int, ...] | None) -> Tensor:
        t = _as(imp, v, DType.F32)
        return imp.g.op("reshape", t, shape=shape) if t.rank and shape is not None else t
    scale = imp.g.op("cast", f32(a_scale, ash) * f32(b_scale, bsh) / f32(y_scale, None), to=DType.F64)
    qt = _qtype(imp, _dtype(imp, yzp) if yzp is not None else at.dtype, "the output")
    return [_requantize(imp, acc, scale, yzp, qt)]


@_handler("QLinearConv")
def _qlinear_conv(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x, x_scale, xzp, w, w_scale, wzp, y_scale, yzp, bias = (list(ins) + [None] * 9)[:9]
    acc = _conv_int(imp, x, w, xzp, wzp, attrs)
    if bias is not None:
        acc = acc + imp.g.op("reshape", _as(imp, bias, DType.I32), shape=(acc.shape[1], 1, 1)[: acc.rank - 1])
    g = imp.g
    ws = _as(imp, w_scale, DType.F32)
    if _numel(imp, ws) > 1:
        ws = g.op("reshape", ws, shape=(acc.shape[1],) + (1,) * (acc.rank - 2))
    scale = g.op("cast", _as(imp, x_scale, DType.F32) * ws / _as(imp, y_scale, DType.F32), to=DType.F64)
    qt = _qtype(imp, _dtype(imp, yzp) if yzp is not None else imp.t(x).dtype, "the output")
    # onnx's reference clips before rounding (np.round after np.clip): the same values for a clip
    # range of integers.
    return [_requantize(imp, acc, scale, yzp, qt)]
