"""ONNX operators translated as exact decompositions into existing RLX IR ops (issue 17).

Atan, Asin and Acos (Cephes-style range reduction + a rational approximation, accurate to a few
ulp in float32 and float64), Col2Im and CenterCropPad (constant index maps), Pow with an integer
base (exact repeated squaring in the integer type), BatchNormalization in training mode, and Scan
and Loop with a trip count known at import (the body is unrolled). The handlers register in
:mod:`rlx_core.frontends.onnx`'s table (that module imports this one), so the ONNX importer stays one
entry point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from .onnx import _Const, _handler, _Importer

_MALFORMED = "the model is malformed: check it with onnx.checker.check_model"


def _static(imp: _Importer, x: Tensor, what: str) -> tuple[int, ...]:
    """``x``'s shape as ints; a symbolic dim is refused with the fix (fix the symbols' sizes)."""
    syms = [d for d in x.shape if isinstance(d, str)]
    if syms:
        raise imp.symbolic(f"{what} needs static dims, got {x.shape}", [str(s) for s in syms])
    return tuple(int(d) for d in x.shape)


def _float_in(imp: _Importer, v: Any, op: str) -> tuple[Tensor, DType]:
    """The input in the dtype the math runs in (f32 for f16/bf16, whose polynomial would lose
    more than their own rounding), and the dtype to return."""
    x = imp.t(v)
    if not x.dtype.is_float:
        raise imp.unsupported(f"{op} on {x.dtype}", fix=f"{op} takes float tensors; cast in the model")
    if x.dtype in (DType.F16, DType.BF16):
        return imp.g.op("cast", x, to=DType.F32), x.dtype
    return x, x.dtype


def _back(imp: _Importer, y: Tensor, dt: DType) -> Tensor:
    return y if y.dtype == dt else imp.g.op("cast", y, to=dt)


# ---------------------------------------------------------------------------------------------
# Inverse trigonometric functions

# Cephes atan (double): atan(t) = t + t * z * P(z) / Q(z), z = t*t, for |t| <= 0.66 after the
# reduction t > tan(3pi/8): pi/2 - atan(1/t); t > 0.66: pi/4 + atan((t-1)/(t+1)).
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880  # tan(3 pi / 8)
_MOREBITS = 6.123233995736765886130e-17  # pi/2 - float64(pi/2), the low part of pi/2


def _atan_t(imp: _Importer, x: Tensor) -> Tensor:
    """atan(x) elementwise with range reduction; +-inf give +-pi/2 and NaN stays NaN."""
    g = imp.g

    def c(v: float) -> Tensor:
        return g.const(v, x.dtype)

    a = g.op("abs", x)
    big = g.op("greater", a, c(_T3P8))
    mid = g.op("logical_and", g.op("greater", a, c(0.66)), g.op("logical_not", big))
    # The reduced argument; the unused branches divide by values that are never 0 for a >= 0.
    t = g.op("where", big, g.op("neg", c(1.0) / a), g.op("where", mid, (a - c(1.0)) / (a + c(1.0)), a))
    base = g.op("where", big, c(math.pi / 2), g.op("where", mid, c(math.pi / 4), c(0.0)))
    low = g.op("where", big, c(_MOREBITS), g.op("where", mid, c(0.5 * _MOREBITS), c(0.0)))
    z = t * t
    p = c(_ATAN_P[0])
    for k in _ATAN_P[1:]:
        p = p * z + c(k)
    q = z + c(_ATAN_Q[0])
    for k in _ATAN_Q[1:]:
        q = q * z + c(k)
    r = base + (t * (z * p / q) + t + low)
    # where(x < 0) keeps NaN (a NaN x is not < 0 and r is NaN already).
    return g.op("where", g.op("less", x, c(0.0)), g.op("neg", r), r)


@_handler("Atan")
def _atan(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x, dt = _float_in(imp, ins[0], "Atan")
    return [_back(imp, _atan_t(imp, x), dt)]


@_handler("Asin")
def _asin(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """asin(x) = atan(x / sqrt((1 - x)(1 + x))): (1 - x)(1 + x) has no cancellation near +-1 (unlike
    1 - x*x); x = +-1 divides by 0 to +-inf, whose atan is +-pi/2; |x| > 1 takes sqrt of a negative
    number, NaN, as ONNX and NumPy give."""
    g = imp.g
    x, dt = _float_in(imp, ins[0], "Asin")
    one = g.const(1.0, x.dtype)
    return [_back(imp, _atan_t(imp, x / g.op("sqrt", (one - x) * (one + x))), dt)]


@_handler("Acos")
def _acos(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): no cancellation near x = 1 (pi/2 - asin(x) would
    lose the small result); x = -1 gives 2 atan(inf) = pi, |x| > 1 a negative ratio, so NaN."""
    g = imp.g
    x, dt = _float_in(imp, ins[0], "Acos")
    one = g.const(1.0, x.dtype)
    r = _atan_t(imp, g.op("sqrt", (one - x) / (one + x)))
    return [_back(imp, r * g.const(2.0, x.dtype), dt)]


# ---------------------------------------------------------------------------------------------
# Col2Im and CenterCropPad: static index maps


def _const_ints(imp: _Importer, v: Any, what: str) -> list[int]:
    if v is None:
        raise imp.unsupported(f"{what} is missing", fix=_MALFORMED)
    if not isinstance(v, _Const):
        raise imp.unsupported(f"{what} is computed at run time from tensor data, so the result's shape is "
                              f"data-dependent", fix=f"give {what} as a constant (an initializer)")
    return [int(x) for x in np.asarray(v.array).reshape(-1)]


@_handler("Col2Im")
def _col2im(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Every column entry (channel c, kernel offset k, block b) lands at one position of the padded
    image, known at import; ``scatter_add`` with that constant map sums the overlaps, and the pads
    are sliced off. Entries that land in the padding are dropped, as the reference drops them."""
    g = imp.g
    x = imp.t(ins[0])
    image = _const_ints(imp, ins[1] if len(ins) > 1 else None, "Col2Im image_shape")
    block = _const_ints(imp, ins[2] if len(ins) > 2 else None, "Col2Im block_shape")
    nd = len(image)
    if len(block) != nd or nd == 0:
        raise imp.unsupported(f"Col2Im image_shape {image} and block_shape {block} differ in length",
                              fix=_MALFORMED)
    dil = [int(v) for v in attrs.get("dilations", [1] * nd)]
    strides = [int(v) for v in attrs.get("strides", [1] * nd)]
    pads = [int(v) for v in attrs.get("pads", [0] * (2 * nd))]
    if len(dil) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise imp.unsupported("Col2Im dilations/strides/pads do not match the spatial rank", fix=_MALFORMED)
    shape = _static(imp, x, "Col2Im")
    if len(shape) != 3:
        raise imp.unsupported(f"Col2Im input has shape {shape}; it must be [N, C * prod(block), L]",
                              fix=_MALFORMED)
    n, ck, length = shape
    kprod = math.prod(block)
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    nblocks = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if kprod == 0 or ck % kprod or math.prod(nblocks) != length or min(nblocks) < 1:
        raise imp.unsupported(f"Col2Im input {shape} does not match image_shape {image}, block_shape "
                              f"{block}, "
                              f"strides {strides}, pads {pads}, dilations {dil} ({nblocks} blocks)",
                              fix=_MALFORMED)
    c = ck // kprod
    # Positions in the padded image, per (kernel offset, block): sum over axes of (b*s + k*d) * pitch.
    koff = np.indices(block).reshape(nd, -1)  # [nd, K]
    boff = np.indices(nblocks).reshape(nd, -1)  # [nd, L]
    pitch = [math.prod(padded[i + 1:]) for i in range(nd)]
    pos = np.zeros((kprod, length), dtype=np.int64)
    for i in range(nd):
        pos += (boff[i][None, :] * strides[i] + koff[i][:, None] * dil[i]) * pitch[i]
    plane = math.prod(padded)
    idx = (np.arange(c, dtype=np.int64)[:, None, None] * plane + pos[None]).reshape(1, -1)
    idx = np.ascontiguousarray(np.broadcast_to(idx, (n, idx.shape[1])))
    upd = g.op("reshape", x, shape=(n, ck * length))
    zeros = g.op("expand", g.const(0, x.dtype), shape=(n, c * plane))
    out = g.op("scatter_add", zeros, imp.param(idx), upd, axis=1)
    out = g.op("reshape", out, shape=(n, c, *padded))
    if any(pads):
        out = g.op("slice", out, starts=tuple(pads[:nd]), stops=tuple(pads[i] + image[i] for i in range(nd)),
                   axes=tuple(range(2, 2 + nd)))
    return [out]


@_handler("CenterCropPad")
def _center_crop_pad(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Per axis: crop the centre (the extra element of an odd difference comes off the end) or pad
    with zeros around it (the extra zero goes at the end), as onnx's reference does."""
    g = imp.g
    x = imp.t(ins[0])
    target = _const_ints(imp, ins[1] if len(ins) > 1 else None, "CenterCropPad shape")
    shape = _static(imp, x, "CenterCropPad")
    r = len(shape)
    axes = [int(a) for a in attrs.get("axes", range(r))]
    if len(axes) != len(target) or any(not -r <= a < r for a in axes) or \
            len({a % r for a in axes}) != len(axes):
        raise imp.unsupported(f"CenterCropPad axes {axes} do not match shape {target} for rank {r}",
                              fix=_MALFORMED)
    starts, stops, sl_axes = [], [], []
    pads = [0] * (2 * r)
    for a, s in zip(axes, target):
        a %= r
        d = shape[a]
        if s < 0:
            raise imp.unsupported(f"CenterCropPad target size {s} is negative", fix=_MALFORMED)
        if s < d:
            lo = (d - s) // 2
            starts.append(lo)
            stops.append(lo + s)
            sl_axes.append(a)
        elif s > d:
            pads[a] = (s - d) // 2
            pads[a + r] = s - d - (s - d) // 2
    if sl_axes:
        x = g.op("slice", x, starts=tuple(starts), stops=tuple(stops), axes=tuple(sl_axes))
    if any(pads):
        x = g.op("pad", x, pads=tuple(pads), value=0.0)
    return [x]


# ---------------------------------------------------------------------------------------------
# Pow with an integer base


def _int_pow_const(imp: _Importer, x: Tensor, e: int) -> Tensor:
    """x ** e for a known e >= 0 by repeated squaring (products wrap, as NumPy's do)."""
    acc: Tensor | None = None
    p = x
    while e:
        if e & 1:
            acc = p if acc is None else acc * p
        e >>= 1
        if e:
            p = p * p
    return acc if acc is not None else imp.g.op("expand", imp.g.const(1, x.dtype), shape=x.shape)


def _int_pow(imp: _Importer, x: Tensor, e: Tensor) -> Tensor:
    """x ** e elementwise, integers of x's dtype (wrapping), e an integer tensor (any sign).

    e >= 0: repeated squaring over every bit of e (the exponent's width), so every result is the
    exact power modulo 2**w, which is what NumPy gives (and ONNX's reference, which uses it).
    e < 0: the power truncated toward zero, as integer division would: 1 for x = 1, +-1 for x = -1
    by the parity of e, 0 otherwise (0 ** -n included, where NumPy raises and C's pow divides by 0)."""
    g = imp.g
    x, e = g.op("expand", x, shape=_bshape(x, e)), g.op("expand", e, shape=_bshape(x, e))
    bits = e.dtype.itemsize * 8 - 1
    zero_e, two_e = g.const(0, e.dtype), g.const(2, e.dtype)
    neg = g.op("less", e, zero_e)
    ek = g.op("where", neg, zero_e, e)
    acc = g.op("expand", g.const(1, x.dtype), shape=x.shape)
    p = x
    for k in range(bits):
        half = ek / two_e
        bit = g.op("not_equal", ek - half * two_e, zero_e)
        acc = g.op("where", bit, acc * p, acc)
        if k + 1 < bits:
            p, ek = p * p, half
    one, m_one = g.const(1, x.dtype), g.const(-1, x.dtype)
    odd = g.op("not_equal", e - (e / two_e) * two_e, zero_e)
    neg_val = g.op("where", g.op("equal", x, one), one,
                   g.op("where", g.op("equal", x, m_one), g.op("where", odd, m_one, one),
                        g.const(0, x.dtype)))
    return g.op("where", neg, neg_val, acc)


def _bshape(a: Tensor, b: Tensor) -> tuple[Any, ...]:
    ra, rb = a.rank, b.rank
    r = max(ra, rb)
    sa = (1,) * (r - ra) + tuple(a.shape)
    sb = (1,) * (r - rb) + tuple(b.shape)
    return tuple(y if x == 1 else x for x, y in zip(sa, sb))


def _float_pow_on_int(imp: _Importer, x: Tensor, e: Tensor) -> Tensor:
    """An integer base with a float exponent: NumPy computes pow in float64 and the result is cast
    back (truncated). An integral exponent goes through the exact integer power instead, so results
    such as 3 ** 2.0 never come out as 8 from a pow that lands one ulp under 9; a fractional one
    gives a non-integral real power, whose truncation is the float64 pow's."""
    g = imp.g
    e64 = e if e.dtype is DType.F64 else g.op("cast", e, to=DType.F64)
    integral = g.op("equal", g.op("floor", e64), e64)
    lim = g.const(float(2 ** 62), DType.F64)
    ei = g.op("cast", g.op("minimum", g.op("maximum", g.op("where", integral, e64, g.const(0.0, DType.F64)),
                                           g.op("neg", lim)), lim), to=DType.I64)
    exact = _int_pow(imp, x, ei)
    real = g.op("cast", g.op("pow", g.op("cast", x, to=DType.F64), e64), to=x.dtype)
    return g.op("where", integral, exact, real)


_FLOAT_POW = None


def _pow_int_base(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if x.dtype.is_float:
        assert _FLOAT_POW is not None
        return list(_FLOAT_POW(imp, node, ins, attrs))
    if not x.dtype.is_int:
        raise imp.unsupported(f"Pow of a {x.dtype} base", fix="Pow takes numeric tensors")
    e_v = ins[1]
    if isinstance(e_v, _Const) and e_v.array.size == 1 and e_v.array.ndim <= x.rank:
        v = float(e_v.array.reshape(-1)[0])
        if v == int(v) and 0 <= v < 2 ** 63:
            return [_int_pow_const(imp, x, int(v))]
    e = imp.t(e_v)
    if e.dtype.is_int:
        return [_int_pow(imp, x, e)]
    if e.dtype.is_float:
        return [_float_pow_on_int(imp, x, e)]
    raise imp.unsupported(f"Pow exponent of dtype {e.dtype}", fix="Pow takes numeric tensors")


def _install_pow() -> None:
    from .onnx import _HANDLERS

    global _FLOAT_POW
    if _FLOAT_POW is None:
        _FLOAT_POW = _HANDLERS["Pow"]  # the float-base translation in onnx.py stays the one used
        _HANDLERS["Pow"] = _pow_int_base


_install_pow()


# ---------------------------------------------------------------------------------------------
# BatchNormalization in training mode


def _bn_training(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Batch statistics over every axis but 1 (population variance), the output normalised with
    them, and the running statistics ``running * momentum + batch * (1 - momentum)`` (ONNX's
    BatchNormalization-14/15 with training_mode=1; the outputs after the first are optional)."""
    g = imp.g
    x0 = imp.t(ins[0])
    if not x0.dtype.is_float or x0.rank < 2:
        raise imp.unsupported(f"BatchNormalization training mode on {x0.dtype} of rank {x0.rank}",
                              fix="BatchNormalization takes float [N, C, ...] tensors")
    cd = DType.F32 if x0.dtype in (DType.F16, DType.BF16) else x0.dtype
    x = x0 if x0.dtype == cd else g.op("cast", x0, to=cd)
    scale, bias, rmean, rvar = (imp.t(v) for v in ins[1:5])
    stat_dt = rmean.dtype
    scale, bias, rmean_c, rvar_c = (t if t.dtype == cd else g.op("cast", t, to=cd)
                                    for t in (scale, bias, rmean, rvar))
    axes = (0, *range(2, x.rank))
    bshape = (1, x.shape[1], *([1] * (x.rank - 2)))
    mean = g.op("reduce_mean", x, axes=axes, keepdims=True)
    d = x - mean
    var = g.op("reduce_mean", d * d, axes=axes, keepdims=True)
    eps = g.const(float(attrs.get("epsilon", 1e-5)), cd)
    y = d * g.op("rsqrt", var + eps) * g.op("reshape", scale, shape=bshape) + \
        g.op("reshape", bias, shape=bshape)
    y = y if y.dtype == x0.dtype else g.op("cast", y, to=x0.dtype)
    momentum = float(attrs.get("momentum", 0.9))
    outs: list[Any] = [y]
    for running, batch in ((rmean_c, mean), (rvar_c, var)):
        b = g.op("reshape", batch, shape=(x.shape[1],))
        r = running * g.const(momentum, cd) + b * g.const(1.0 - momentum, cd)
        outs.append(r if r.dtype == stat_dt else g.op("cast", r, to=stat_dt))
    return outs


def _bn_outputs_rule(attrs: Any, opset: int, node: Any) -> Any:
    """Statistics outputs are translated in training mode (BatchNormalization-14 and newer) only:
    before 14 they meant training too, with other outputs (saved mean and variance)."""
    if node is None or len([o for o in node.output if o]) <= 1:
        return None
    if opset >= 14 and int(attrs.get("training_mode", 0)):
        return None
    return ("the running_mean/running_var outputs without training_mode=1 are not translated (ONNX "
            "defines them only in training mode)",
            "use only output 0 (Y), or export BatchNormalization-14+ with training_mode=1")


def _install_bn() -> None:
    from . import onnx as _o

    inference = _o._HANDLERS["BatchNormalization"]
    if getattr(inference, "_rlx_training", False):
        return
    # The training_mode refusal goes; every other rule (spatial=0...) stays, and the statistics
    # outputs are refused up front (coverage() included) where they are not translated.
    _o._ATTR_RULES["BatchNormalization"] = [
        r for r in _o._ATTR_RULES.get("BatchNormalization", [])
        if r({"training_mode": 1}, 15, None) is None or r({"training_mode": 0}, 15, None) is not None
    ] + [_bn_outputs_rule]
    _o._MAX_OUTPUTS["BatchNormalization"] = 3

    def bn(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        if int(attrs.get("training_mode", 0)):
            return _bn_training(imp, node, ins, attrs)
        return list(inference(imp, node, ins, attrs))

    bn._rlx_training = True  # type: ignore[attr-defined]
    _o._HANDLERS["BatchNormalization"] = bn


_install_bn()


# ---------------------------------------------------------------------------------------------
# Scan and Loop: unrolled at import

#: The most iterations a Scan or Loop is unrolled into (each copies the body into the graph).
MAX_UNROLL = 4096


def _run_body(imp: _Importer, body: Any, feeds: Sequence[Any], op: str) -> list[Any]:
    """One copy of ``body`` with its inputs bound to ``feeds``; outer-scope names stay visible."""
    if len(body.input) != len(feeds):
        raise imp.unsupported(f"{op} body takes {len(body.input)} inputs, the node gives {len(feeds)}",
                              fix=_MALFORMED)
    for vi, v in zip(body.input, feeds):
        imp.env[vi.name] = v
    for t in body.initializer:
        imp.env[t.name] = _Const(imp._tensor_array(t), t.name)
    saved = (imp.node, imp.node_where, imp.g.prefix)
    imp.depth += 1
    try:
        imp._run_nodes(body.node)
    finally:
        imp.depth -= 1
        imp.node, imp.node_where, imp.g.prefix = saved
    return [imp.env[o.name] for o in body.output]


def _shape_of(v: Any) -> tuple[Any, ...]:
    if isinstance(v, Tensor):
        return tuple(v.shape)
    return tuple(np.shape(v.arr if hasattr(v, "arr") else v.array))


def _stack(imp: _Importer, vals: Sequence[Any], axis: int, op: str) -> Any:
    """Per-iteration values stacked along a new ``axis`` (constants stay constants)."""
    shapes = {_shape_of(v) for v in vals}
    if len(shapes) != 1:
        raise imp.unsupported(f"{op} scan output changes shape across iterations "
                              f"({sorted(map(str, shapes))})",
                              fix="RLX tensors have one static shape; make the body's scan outputs the same "
                                  "shape every iteration")
    if all(isinstance(v, _Const) for v in vals):
        return _Const(np.stack([v.array for v in vals], axis=axis))
    ts = [imp.t(v) for v in vals]
    dt = ts[0].dtype
    ts = [t if t.dtype == dt else imp.g.op("cast", t, to=dt) for t in ts]
    r = ts[0].rank + 1
    ax = axis % r
    parts = [imp.g.op("reshape", t, shape=(*t.shape[:ax], 1, *t.shape[ax:])) for t in ts]
    return parts[0] if len(parts) == 1 else imp.g.op("concat", *parts, axis=ax)


def _take(imp: _Importer, v: Any, axis: int, i: int) -> Any:
    """Element ``i`` along ``axis`` (the axis dropped)."""
    if isinstance(v, _Const):
        return _Const(np.take(v.array, i, axis=axis))
    t = imp.t(v)
    s = imp.g.op("slice", t, starts=(i,), stops=(i + 1,), axes=(axis,))
    return imp.g.op("reshape", s, shape=t.shape[:axis] + t.shape[axis + 1:])


@_handler("Scan")
def _scan(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Scan-9 and newer: the body runs once per element of the scan axis, which is static, with the
    states carried from one copy to the next. Scan-8 (a batch axis 0, the sequence on axis 1) runs
    that once per batch entry."""
    body = attrs["body"]
    m = int(attrs["num_scan_inputs"])
    if imp.opset < 9:
        return _scan8(imp, body, ins, m, attrs)
    n_state = len(ins) - m
    if m < 1 or n_state < 0:
        raise imp.unsupported(f"Scan num_scan_inputs={m} with {len(ins)} inputs", fix=_MALFORMED)
    n_scan_out = len(body.output) - n_state
    return _scan_core(imp, body, ins, m, [int(a) for a in attrs.get("scan_input_axes", [0] * m)],
                      [int(a) for a in attrs.get("scan_input_directions", [0] * m)],
                      [int(a) for a in attrs.get("scan_output_axes", [0] * n_scan_out)],
                      [int(a) for a in attrs.get("scan_output_directions", [0] * n_scan_out)])


def _scan8(imp: _Importer, body: Any, ins: list, m: int, attrs: dict) -> list:
    seq, rest = (ins[0] if ins else None), ins[1:]
    n_state = len(rest) - m
    if m < 1 or n_state < 0 or any(v is None for v in rest):
        raise imp.unsupported(f"Scan num_scan_inputs={m} with {len(ins)} inputs", fix=_MALFORMED)
    shape = _shape_of(rest[n_state])
    if len(shape) < 2 or any(isinstance(d, str) for d in shape[:2]):
        raise imp.unsupported(f"Scan-8 scan input has shape {shape}; it needs static [batch, sequence, ...]",
                              fix="fix the batch and sequence sizes (symbols) at import")
    batch, steps = int(shape[0]), int(shape[1])
    if seq is not None:
        if not isinstance(seq, _Const):
            raise imp.unsupported("Scan-8 sequence_lens computed at run time (per-entry lengths)",
                                  fix="export without sequence_lens, or convert the model to opset 9+")
        if np.any(np.asarray(seq.array) != steps):
            raise imp.unsupported(f"Scan-8 sequence_lens {seq.array.tolist()} shorter than the sequence "
                                  f"({steps}) is not translated", fix="give every entry the full length")
    dirs = [int(a) for a in attrs.get("directions", [0] * m)]
    n_scan_out = len(body.output) - n_state
    per: list[list[Any]] = [[] for _ in range(n_state + n_scan_out)]
    for b in range(batch):
        outs = _scan_core(imp, body, [_take(imp, v, 0, b) for v in rest], m, [0] * m, dirs,
                          [0] * n_scan_out, [0] * n_scan_out)
        for k, v in enumerate(outs):
            per[k].append(v)
    return [_stack(imp, vals, 0, "Scan") for vals in per]


def _scan_core(imp: _Importer, body: Any, ins: list, m: int, in_axes: list[int], in_dirs: list[int],
               out_axes: list[int], out_dirs: list[int]) -> list:
    n_state = len(ins) - m
    n_scan_out = len(body.output) - n_state
    scans = ins[n_state:]
    lengths = set()
    axes = []
    for v, ax in zip(scans, in_axes):
        shape = _shape_of(v)
        ax %= max(len(shape), 1)
        axes.append(ax)
        d = shape[ax]
        if isinstance(d, str):
            raise imp.symbolic(f"Scan over the symbolic dim {d!r} (the trip count) cannot be unrolled", [d])
        lengths.add(int(d))
    if len(lengths) != 1:
        raise imp.unsupported(f"Scan inputs have different lengths {sorted(lengths)} along their scan axes",
                              fix=_MALFORMED)
    steps = lengths.pop()
    if steps > MAX_UNROLL:
        raise imp.unsupported(f"Scan of {steps} steps is too long to unroll (at most {MAX_UNROLL})",
                              fix="shorten the sequence, or run this model in ONNX Runtime")
    if steps == 0 and n_scan_out:
        raise imp.unsupported("Scan of 0 steps with scan outputs (their shape is unknown)",
                              fix="give the Scan a non-empty sequence")
    states = list(ins[:n_state])
    per_out: list[list[Any]] = [[] for _ in range(n_scan_out)]
    snapshot = dict(imp.env)
    for t in range(steps):
        feeds = [_take(imp, v, ax, steps - 1 - t if rev else t) for v, ax, rev in zip(scans, axes, in_dirs)]
        outs = _run_body(imp, body, states + feeds, "Scan")
        states = outs[:n_state]
        for k, v in enumerate(outs[n_state:]):
            per_out[k].append(v)
    imp.env.clear()
    imp.env.update(snapshot)
    results = list(states)
    for k, vals in enumerate(per_out):
        if out_dirs[k]:
            vals = vals[::-1]
        r = len(_shape_of(vals[0])) + 1
        results.append(_stack(imp, vals, out_axes[k] % r, "Scan"))
    return results


@_handler("Loop")
def _loop(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Loop-11 and newer with a trip count and condition known at import: the body is copied once
    per iteration; the condition each copy returns must fold to a constant (a data-dependent exit
    is refused, as its number of iterations, and so the graph, is not known at import)."""
    body = attrs["body"]
    m_v = ins[0] if ins else None
    c_v = ins[1] if len(ins) > 1 else None
    carried = list(ins[2:])
    n_carried = len(carried)
    n_scan_out = len(body.output) - 1 - n_carried
    if n_scan_out < 0:
        raise imp.unsupported(f"Loop body has {len(body.output)} outputs for {n_carried} loop-carried values",
                              fix=_MALFORMED)

    def const_scalar(v: Any, what: str, node_input: bool = True) -> Any:
        if isinstance(v, _Const):
            return v.array.reshape(-1)[0]
        msg = f"Loop {what} is computed at run time (data-dependent control flow)"
        if isinstance(v, Tensor) and node_input:  # staged execution computes it first, as for If
            raise imp.needs_values([v], msg)
        if imp.has_symbols():
            raise imp.symbolic(msg)
        raise imp.unsupported(msg, fix="give the trip count and condition as constants, or export the loop "
                                       "unrolled (a fixed number of iterations)")

    trip = None if m_v is None else int(const_scalar(m_v, "trip count M"))
    cond = True if c_v is None else bool(const_scalar(c_v, "condition"))
    if trip is None and c_v is None:
        raise imp.unsupported("Loop with neither a trip count nor a condition never ends", fix=_MALFORMED)
    limit = MAX_UNROLL if trip is None else trip
    if trip is not None and trip > MAX_UNROLL:
        raise imp.unsupported(f"Loop of {trip} iterations is too long to unroll (at most {MAX_UNROLL})",
                              fix="run this model in ONNX Runtime, or export fewer iterations")
    per_out: list[list[Any]] = [[] for _ in range(n_scan_out)]
    snapshot = dict(imp.env)
    i = 0
    while cond and i < limit:
        feeds = [_Const(np.array(i, np.int64)), _Const(np.array(cond, np.bool_)), *carried]
        outs = _run_body(imp, body, feeds, "Loop")
        cond = bool(const_scalar(outs[0], "condition (returned by the body)", node_input=False))
        carried = outs[1:1 + n_carried]
        for k, v in enumerate(outs[1 + n_carried:]):
            per_out[k].append(v)
        i += 1
    if cond and trip is None:
        raise imp.unsupported(f"Loop ran {MAX_UNROLL} iterations without its condition becoming false",
                              fix="give the Loop a trip count, or run this model in ONNX Runtime")
    imp.env.clear()
    imp.env.update(snapshot)
    results = list(carried)
    for vals in per_out:
        if not vals:
            raise imp.unsupported("Loop of 0 iterations with scan outputs (their shape is unknown)",
                                  fix="make the loop run at least once")
        results.append(_stack(imp, vals, 0, "Loop"))
    return results


def _install_versions() -> None:
    from . import onnx as _o

    # Scan-9 differs from Scan-11 only in that it takes no negative axes, which the handler
    # accepts; Scan-8 (batch axis, sequence_lens) has its own path. Scan/Loop-24 and -25 add only
    # dtypes RLX does not have (float8e8m0, int2, uint2), refused by dtype.
    _o._OP_SINCE.setdefault("Scan", 8)
    for op in ("Scan", "Loop"):
        _o._OP_REVIEWED[op] = max(_o._OP_REVIEWED.get(op, 0), 25)
    # ReverseSequence-28 adds bfloat16 only (the gather is dtype-agnostic).
    _o._OP_REVIEWED["ReverseSequence"] = max(_o._OP_REVIEWED.get("ReverseSequence", 0), 28)


_install_versions()


# ---------------------------------------------------------------------------------------------
# Bitwise operators: the bitwise_* IR ops (rlx_core.ir.ops.bitwise)

_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


def _bitwise_binary(rlx_op: str) -> Any:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        a, b = imp.pair(ins[0], ins[1])
        if not a.dtype.is_int or a.dtype != b.dtype:
            raise imp.unsupported(f"{node.op_type} on {a.dtype} and {b.dtype}",
                                  fix=f"{node.op_type} takes two integer tensors of one dtype")
        _bitwise_dtype(imp, node, rlx_op, a.dtype)
        return [imp.g.op(rlx_op, a, b)]
    return h


def _bitwise_dtype(imp: _Importer, node: Any, rlx_op: str, dt: DType) -> None:
    # An integer type the IR op does not take yet (u16/u32/u64) is refused here, not by the builder.
    from ..ir.schema import REGISTRY

    allowed = REGISTRY.get(rlx_op).dtypes
    if dt not in allowed:
        raise imp.unsupported(f"{node.op_type} on {dt}: RLX's {rlx_op} takes {', '.join(map(str, allowed))}",
                              fix="cast the operands to one of those types in the model")


for _onnx_op, _rlx_op in _BITWISE.items():
    _handler(_onnx_op)(_bitwise_binary(_rlx_op))


@_handler("BitwiseNot")
def _bitwise_not(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if not x.dtype.is_int:
        raise imp.unsupported(f"BitwiseNot on {x.dtype}", fix="BitwiseNot takes integer tensors")
    _bitwise_dtype(imp, node, "bitwise_not", x.dtype)
    return [imp.g.op("bitwise_not", x)]


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer (integer tokens): n-gram counts by comparison with the constant pool


def _tfidf_grams(imp: _Importer, attrs: dict) -> dict[int, dict[tuple[int, ...], int]]:
    """Per n-gram size in [min, max]: gram -> output index (a gram listed twice keeps its last
    index, as onnx's reference's trie does)."""
    if attrs.get("pool_strings"):
        raise imp.unsupported("TfIdfVectorizer over strings (pool_strings) is not translated",
                              fix="RLX has numeric dtypes only: map the tokens to int64 ids before it")
    pool = [int(v) for v in attrs.get("pool_int64s", [])]
    counts = [int(v) for v in attrs.get("ngram_counts", [])]
    indexes = [int(v) for v in attrs.get("ngram_indexes", [])]
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    grams: dict[int, dict[tuple[int, ...], int]] = {}
    gid = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        if (end - start) % size:
            raise imp.unsupported(f"TfIdfVectorizer pool section of {size}-grams has {end - start} items",
                                  fix=_MALFORMED)
        for k in range(start, end, size):
            if lo <= size <= hi:
                if gid >= len(indexes):
                    raise imp.unsupported("TfIdfVectorizer ngram_indexes is shorter than the pool",
                                          fix=_MALFORMED)
                grams.setdefault(size, {})[tuple(pool[k:k + size])] = indexes[gid]
            gid += 1
    return grams


@_handler("TfIdfVectorizer")
def _tfidf(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """An n-gram of size n counts at every start s and skip distance d (1 to max_skip_count + 1; 1
    only for unigrams) with ``x[s + d k] == gram[k]`` for all k < n: windows compared with the
    constant pool, counted per gram, then summed into the output slots (a 0/1 matrix product,
    exact for counts below 2**24) and weighted per ``mode`` as onnx's reference does."""
    g = imp.g
    x = imp.t(ins[0])
    if not x.dtype.is_int:
        raise imp.unsupported(f"TfIdfVectorizer on {x.dtype}", fix="give int32/int64 token ids")
    shape = _static(imp, x, "TfIdfVectorizer")
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[0] < 1):
        raise imp.unsupported(f"TfIdfVectorizer input has shape {shape}; it must be [C] or [B, C]",
                              fix=_MALFORMED)
    mode = str(attrs.get("mode", ""))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise imp.unsupported(f"TfIdfVectorizer mode={mode!r}", fix="use TF, IDF or TFIDF")
    grams = _tfidf_grams(imp, attrs)
    indexes = [int(v) for v in attrs.get("ngram_indexes", [])]
    out_size = max(indexes) + 1 if indexes else 0
    weights = [float(v) for v in attrs.get("weights", [])]
    if weights and mode != "TF":
        if len(weights) != len(indexes):
            raise imp.unsupported(f"TfIdfVectorizer has {len(weights)} weights for {len(indexes)} n-grams",
                                  fix=_MALFORMED)
        if indexes != list(range(len(indexes))):
            # The spec weighs the i-th n-gram; onnx's reference and ONNX Runtime weigh output slot i.
            # They agree only when n-gram i goes to slot i.
            raise imp.unsupported("TfIdfVectorizer weights with ngram_indexes other than 0, 1, 2, ... are "
                                  "ambiguous (the spec weighs the i-th n-gram, ONNX Runtime output slot i)",
                                  fix="give ngram_indexes in order (n-gram i in output slot i), or apply "
                                      "the weights after a TF-mode vectorizer")
    rows, c = (1, shape[0]) if len(shape) == 1 else shape
    x2 = g.op("cast", g.op("reshape", x, shape=(rows, c)), to=DType.I64)
    max_skip = int(attrs.get("max_skip_count", 0))
    total = g.op("expand", g.const(0.0, DType.F32), shape=(rows, out_size))
    for n, table in sorted(grams.items()):
        pool = np.array(list(table), np.int64).reshape(len(table), n)
        slots = np.zeros((len(table), out_size), np.float32)
        slots[np.arange(len(table)), list(table.values())] = 1.0
        counts = None
        for d in range(1, (1 if n == 1 else max_skip + 1) + 1):
            span = c - d * (n - 1)
            if span <= 0:
                break
            cols = [g.op("slice", x2, starts=(d * k,), stops=(d * k + span,), axes=(1,)) for k in range(n)]
            win = g.op("reshape", g.op("concat", *[g.op("reshape", t, shape=(rows, span, 1)) for t in cols],
                                       axis=2), shape=(rows, span, 1, n))
            hit = g.op("equal", win, imp.param(pool) if pool.size > 16 else g.const(pool, DType.I64))
            hit = g.op("reduce_min", g.op("cast", hit, to=DType.F32), axes=(3,), keepdims=False)
            cnt = g.op("reduce_sum", hit, axes=(1,), keepdims=False)  # [rows, grams]
            counts = cnt if counts is None else counts + cnt
        if counts is not None:
            total = total + counts @ imp.param(slots)
    if mode == "IDF":
        w = np.array(weights[:out_size] if weights else [1.0] * out_size, np.float32)
        wt = imp.param(w) if w.size > 16 else g.const(w, DType.F32)
        y = g.op("where", g.op("greater", total, g.const(0.0, DType.F32)),
                 g.op("expand", wt, shape=(rows, out_size)), g.const(0.0, DType.F32))
    elif mode == "TFIDF" and weights:
        w = np.array(weights[:out_size], np.float32)
        y = total * (imp.param(w) if w.size > 16 else g.const(w, DType.F32))
    else:
        y = total
    return [g.op("reshape", y, shape=(out_size,)) if len(shape) == 1 else y]


# ---------------------------------------------------------------------------------------------
# Operators defined by an ONNX function body: expanded into it at import


def _type_proto(imp: _Importer, v: Any) -> Any:
    from onnx import helper

    from .onnx import _ONNX_TO_DTYPE, _Sym

    codes = {dt: code for code, dt in _ONNX_TO_DTYPE.items()}
    if isinstance(v, Tensor):
        dt, shape = v.dtype, [d if isinstance(d, int) else str(d) for d in v.shape]
    elif isinstance(v, _Sym):
        dt, shape = v.dtype, list(np.shape(v.arr))
    else:
        dt, shape = DType.parse(v.array.dtype), list(v.array.shape)
    return helper.make_tensor_type_proto(codes[dt], shape)


def _function_body(imp: _Importer, node: Any, ins: list) -> Any:
    """The FunctionProto onnx defines ``node``'s operator with, at the model's opset."""
    import onnx.defs
    from onnx import FunctionProto

    schema: Any = onnx.defs.get_schema(node.op_type, imp.opset, "")  # its stubs lack the function API
    if schema.has_function:
        return schema.function_body
    if schema.has_context_dependent_function:
        types = [_type_proto(imp, v) if v is not None else _empty_type() for v in ins]  # one per input
        proto = FunctionProto()
        proto.ParseFromString(schema.get_context_dependent_function(
            node.SerializeToString(), [t.SerializeToString() for t in types]))
        return proto
    raise imp.unsupported(f"{node.op_type}-{schema.since_version} has no ONNX function body to expand",
                          fix="rewrite it with supported operators before export")


def _empty_type() -> Any:
    from onnx import TypeProto

    return TypeProto()


def _resolve_refs(fn_node: Any, node: Any) -> Any:
    """A copy of a function node with attributes that refer to the calling node's (``ref_attr_name``)
    replaced by the node's values; an attribute the node does not set takes its default."""
    from onnx import NodeProto

    out = NodeProto()
    out.CopyFrom(fn_node)
    del out.attribute[:]
    given = {a.name: a for a in node.attribute}
    for a in fn_node.attribute:
        if a.ref_attr_name:
            src = given.get(a.ref_attr_name)
            if src is None:
                continue
            b = out.attribute.add()
            b.CopyFrom(src)
            b.name = a.name
        else:
            out.attribute.add().CopyFrom(a)
    return out


def _expand_function(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """The operator as its ONNX function body (the spec's own definition, e.g. a Scan over time for
    LinearAttention), translated node by node; the body's names live only while it is expanded."""
    body = _function_body(imp, node, ins)
    nodes = [_resolve_refs(n, node) for n in body.node]
    snapshot = dict(imp.env)
    for name, v in zip(body.input, ins):
        if name:
            imp.env.pop(name, None)
            if v is not None:
                imp.env[name] = v
    saved = (imp.node, imp.node_where, imp.g.prefix)
    imp.depth += 1
    try:
        imp._run_nodes(nodes)
        outs = [imp.env.get(o) for o in body.output]
    finally:
        imp.depth -= 1
        imp.node, imp.node_where, imp.g.prefix = saved
        imp.env.clear()
        imp.env.update(snapshot)
    return outs


for _op in ("LinearAttention", "CausalConvWithState", "SwiGLU"):
    _handler(_op)(_expand_function)


# ---------------------------------------------------------------------------------------------
# CumProd, EyeLike, ReverseSequence

#: The most elements CumProd's n x n masked product may hold (it is O(n^2) per row).
CUMPROD_MAX_ELEMENTS = 1 << 26


@_handler("CumProd")
def _cumprod(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """out[i] = prod of x[j] over j <= i (j < i exclusive; j >= i / j > i reversed): x broadcast to
    [..., n, n] with 1 where the mask is off, then reduce_prod over j. Integer products wrap and are
    exact in any order; float products round per step as a sequential cumprod does (the order of
    the multiplications may differ)."""
    g = imp.g
    x = imp.t(ins[0])
    if not isinstance(ins[1], _Const) or ins[1].array.size != 1:
        raise imp.unsupported("CumProd axis is computed at run time from tensor data",
                              fix="give axis as a constant scalar")
    shape = _static(imp, x, "CumProd")
    r = len(shape)
    axis = int(ins[1].array.reshape(-1)[0])
    if not -r <= axis < r:
        raise imp.unsupported(f"CumProd axis {axis} is out of range for rank {r}", fix=_MALFORMED)
    axis %= r
    n = shape[axis]
    if math.prod(shape) * n > CUMPROD_MAX_ELEMENTS:
        raise imp.unsupported(f"CumProd over {n} elements of a {shape} tensor needs {math.prod(shape) * n} "
                              f"intermediate elements (more than {CUMPROD_MAX_ELEMENTS})",
                              fix="run this model in ONNX Runtime, or split the axis")
    exclusive, reverse = bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = (j > i if exclusive else j >= i) if reverse else (j < i if exclusive else j <= i)
    perm = [a for a in range(r) if a != axis] + [axis]
    xt = x if axis == r - 1 else g.op("transpose", x, perm=tuple(perm))
    rows = g.op("reshape", xt, shape=(*xt.shape[:-1], 1, n))  # [..., 1 (i), n (j)]
    masked = g.op("where", g.const(keep, DType.BOOL) if keep.size <= 16 else imp.param(keep), rows,
                  g.const(1, x.dtype))
    y = g.op("reduce_prod", masked, axes=(r,), keepdims=False)  # [..., n (i)]
    if axis != r - 1:
        y = g.op("transpose", y, perm=tuple(int(p) for p in np.argsort(perm)))
    return [y]


@_handler("EyeLike")
def _eyelike(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Ones on diagonal k of a matrix shaped like the input, computed with iota (no input data is
    read, only its static shape)."""
    from .onnx import _ONNX_TO_DTYPE

    g = imp.g
    x = ins[0]
    xt = x if isinstance(x, Tensor) else imp.t(x)
    shape = _static(imp, xt, "EyeLike")
    if len(shape) != 2:
        raise imp.unsupported(f"EyeLike input has shape {shape}; it must be 2-D", fix=_MALFORMED)
    dt = xt.dtype if "dtype" not in attrs else _ONNX_TO_DTYPE.get(int(attrs["dtype"]))
    if dt is None:
        raise imp.unsupported(f"EyeLike dtype {attrs['dtype']} is not an RLX dtype",
                              fix="use a float, integer or bool dtype RLX has")
    k = int(attrs.get("k", 0))
    rows = g.op("iota", shape=shape, axis=0, dtype=DType.I64)
    cols = g.op("iota", shape=shape, axis=1, dtype=DType.I64)
    return [g.op("cast", g.op("equal", rows + g.const(k, DType.I64), cols), to=dt)]


@_handler("ReverseSequence")
def _reverse_sequence(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Per batch entry b, the first sequence_lens[b] steps reversed: step t reads t' = len - 1 - t
    where t < len, else t; one gather over the flattened (time, batch) axes with index t' * B + b.
    A length above the time axis gives an index out of range, which the gather reports."""
    g = imp.g
    x = imp.t(ins[0])
    lens = imp.t(ins[1])
    if not lens.dtype.is_int:
        raise imp.unsupported(f"ReverseSequence sequence_lens has dtype {lens.dtype}", fix=_MALFORMED)
    shape = _static(imp, x, "ReverseSequence")
    r = len(shape)
    bax, tax = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    if r < 2 or {bax, tax} != {0, 1}:
        raise imp.unsupported(f"ReverseSequence batch_axis={bax}, time_axis={tax} on rank {r}",
                              fix="ONNX allows batch_axis/time_axis 0 and 1 (one each)")
    xt = x if tax == 0 else g.op("transpose", x, perm=(1, 0, *range(2, r)))  # [T, B, ...]
    t_len, b_len = (shape[0], shape[1]) if tax == 0 else (shape[1], shape[0])
    ln = g.op("reshape", g.op("cast", lens, to=DType.I64), shape=(1, b_len))
    t = g.op("iota", shape=(t_len, b_len), axis=0, dtype=DType.I64)
    b = g.op("iota", shape=(t_len, b_len), axis=1, dtype=DType.I64)
    src = g.op("where", g.op("less", t, ln), ln - g.const(1, DType.I64) - t, t)
    flat_idx = g.op("reshape", src * g.const(b_len, DType.I64) + b, shape=(t_len * b_len,))
    flat = g.op("reshape", xt, shape=(t_len * b_len, *shape[2:]))
    y = g.op("reshape", g.op("gather", flat, flat_idx, axis=0), shape=xt.shape)
    return [y if tax == 0 else g.op("transpose", y, perm=(1, 0, *range(2, r)))]
