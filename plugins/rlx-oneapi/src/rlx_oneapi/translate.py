"""LIR steps -> one OpenVINO ``ov.Model`` (opset13 nodes), compiled once by the OpenVINO runtime.

Every claimed op has one translation here; :data:`RULES` is also where the claims come from
(:mod:`rlx_oneapi.plugin`), so a variant is claimed only when a translation exists for it. The
translations encode the reference semantics where OpenVINO's op differs: NaN-propagating
``maximum``/``minimum``/``reduce_max``/``reduce_min`` (the CPU plugin's max drops NaN), ``cast`` to
bool as ``x != 0`` (its Convert maps NaN to false), Python slicing resolved to concrete bounds.

Imports OpenVINO at import time: only :func:`build_model` users (``rlx_compile``) import this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from rlx_core.plugin import DType, IRError, Program, Step, normalize_axis, slice_params

#: RLX dtype -> OpenVINO element type.
OV_TYPES: dict[DType, Any] = {
    DType.F16: ov.Type.f16, DType.BF16: ov.Type.bf16, DType.F32: ov.Type.f32, DType.F64: ov.Type.f64,
    DType.I8: ov.Type.i8, DType.I16: ov.Type.i16, DType.I32: ov.Type.i32, DType.I64: ov.Type.i64,
    DType.U8: ov.Type.u8, DType.BOOL: ov.Type.boolean,
}

Out = Any  # an ov.Output
Translate = Callable[["Ctx", Step, list[Out]], Out]


@dataclass
class Ctx:
    program: Program

    def dtype(self, value: str) -> DType:
        return self.program.graph.types[value].dtype

    def shape(self, value: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.program.graph.types[value].shape)


def _i64(values: Sequence[int]) -> Any:
    return ops.constant(np.asarray(list(values), np.int64))


def _constant(data: np.ndarray, dtype: DType) -> Out:
    if dtype == DType.BF16:  # OpenVINO's constant() takes no bf16 arrays: f32 holds every bf16 exactly
        return ops.convert(ops.constant(np.asarray(data, np.float32)), ov.Type.bf16).output(0)
    # np.require keeps a 0-d array 0-d (ascontiguousarray would make it 1-d).
    return ops.constant(np.require(np.asarray(data, dtype.np), requirements="C")).output(0)


def _scalar_like(value: float, dtype: DType) -> Any:
    return _constant(np.asarray(value, dtype.np), dtype)


def _nan_aware(combine: Callable[..., Any]) -> Callable[[Ctx, Step, list[Out]], Out]:
    """A float max/min whose result is NaN when either operand is: OpenVINO's CPU max/min return
    the other operand (x86 maxps semantics), the reference propagates NaN."""
    def tr(ctx: Ctx, s: Step, x: list[Out]) -> Out:
        r = combine(x[0], x[1]).output(0)
        if not ctx.dtype(s.inputs[0]).is_float:
            return r
        r = ops.select(ops.is_nan(x[1]), x[1], r).output(0)
        return ops.select(ops.is_nan(x[0]), x[0], r).output(0)
    return tr


def _nan_kept(f: Callable[..., Any]) -> Translate:
    """A float unary op whose NaN lanes stay NaN: OpenVINO's CPU exp maps NaN to +inf."""
    def tr(ctx: Ctx, s: Step, x: list[Out]) -> Out:
        return ops.select(ops.is_nan(x[0]), x[0], f(x[0])).output(0)
    return tr


def _ordered(f: Callable[..., Any]) -> Translate:
    """An ordered float comparison, false when either operand is NaN: OpenVINO's CPU greater and
    greater_equal are true for NaN > x."""
    def tr(ctx: Ctx, s: Step, x: list[Out]) -> Out:
        nan = ops.logical_or(ops.is_nan(x[0]), ops.is_nan(x[1])).output(0)
        return ops.logical_and(f(x[0], x[1]), ops.logical_not(nan)).output(0)
    return tr


def _binary(f: Callable[..., Any]) -> Translate:
    return lambda ctx, s, x: f(x[0], x[1]).output(0)


def _unary(f: Callable[..., Any]) -> Translate:
    return lambda ctx, s, x: f(x[0]).output(0)


def _axes(s: Step, rank: int) -> list[int]:
    axes = s.attrs.get("axes")
    if axes is None:
        return list(range(rank))
    return sorted(normalize_axis(int(a), rank) for a in axes)  # type: ignore[union-attr]


def _reduce(f: Callable[..., Any], nan_aware: bool = False) -> Translate:
    def tr(ctx: Ctx, s: Step, x: list[Out]) -> Out:
        rank = len(ctx.shape(s.inputs[0]))
        axes, keep = _axes(s, rank), bool(s.attrs.get("keepdims", False))
        if not axes:  # reducing no axis is the identity
            return x[0]
        r = f(x[0], _i64(axes), keep).output(0)
        if nan_aware and ctx.dtype(s.inputs[0]).is_float:
            has_nan = ops.reduce_logical_or(ops.is_nan(x[0]), _i64(axes), keep).output(0)
            r = ops.select(has_nan, _scalar_like(np.nan, ctx.dtype(s.inputs[0])), r).output(0)
        return r
    return tr


#: Narrow integer -> (bits, signed): casts into them wrap modulo 2**bits like the reference.
NARROW = {DType.I8: (8, True), DType.U8: (8, False), DType.I16: (16, True)}


def _cast(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    src, dst = ctx.dtype(s.inputs[0]), ctx.dtype(s.outputs[0])
    if dst == DType.BOOL and src != DType.BOOL:
        # Convert maps NaN to false; the reference's ->bool is x != 0 (NaN is true).
        return ops.not_equal(x[0], _scalar_like(0, src)).output(0)
    if dst in NARROW and src.is_int and src != dst:
        # Convert saturates out-of-range integers (the reference wraps): keep the low bits in i32
        # first, so the final Convert only sees values in range.
        bits, signed = NARROW[dst]
        v = x[0] if src == DType.I32 else ops.convert(x[0], ov.Type.i32).output(0)
        half, mask = 1 << (bits - 1), (1 << bits) - 1
        if signed:
            v = ops.add(v, ops.constant(np.int32(half))).output(0)
        v = ops.bitwise_and(v, ops.constant(np.int32(mask))).output(0)
        if signed:
            v = ops.subtract(v, ops.constant(np.int32(half))).output(0)
        return ops.convert(v, OV_TYPES[dst]).output(0)
    return ops.convert(x[0], OV_TYPES[dst]).output(0)


def _matmul(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.matmul(x[0], x[1], False, False).output(0)


def _reshape(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.reshape(x[0], _i64(ctx.shape(s.outputs[0])), False).output(0)


def _expand(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.broadcast(x[0], _i64(ctx.shape(s.outputs[0])), "numpy").output(0)


def _transpose(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    perm = s.attrs.get("perm")
    order = list(range(rank))[::-1] if perm is None else [normalize_axis(int(p), rank) for p in perm]  # type: ignore[union-attr]
    return ops.transpose(x[0], _i64(order)).output(0)


def _slice(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    shape = ctx.shape(s.inputs[0])
    starts, stops, steps, axes = [], [], [], []
    for ax, sl in slice_params(s.attrs, shape):
        # Resolve Python's clamping here so OpenVINO gets bounds with one meaning; a negative step
        # that runs to the front needs a stop before index 0, which only INT64_MIN says.
        a, b, c = sl.indices(shape[ax])
        starts.append(a)
        stops.append(b if b >= 0 else np.iinfo(np.int64).min)
        steps.append(c)
        axes.append(ax)
    if not axes:
        return x[0]
    return ops.slice(x[0], _i64(starts), _i64(stops), _i64(steps), _i64(axes)).output(0)


def _concat(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.outputs[0]))
    return ops.concat(x, normalize_axis(int(s.attrs["axis"]), rank)).output(0)  # type: ignore[arg-type]


def _pad(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    pads = [int(p) for p in s.attrs["pads"]]  # type: ignore[union-attr]
    rank = len(pads) // 2
    dt = ctx.dtype(s.inputs[0])
    value = _scalar_like(float(s.attrs.get("value", 0.0)), dt)  # type: ignore[arg-type]
    return ops.pad(x[0], _i64(pads[:rank]), _i64(pads[rank:]), "constant", value).output(0)


def _gather(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    # Gather-8 takes negative indices from the end and yields 0 for any index out of range, so no
    # read leaves the buffer even for device-computed indices.
    return ops.gather(x[0], x[1], normalize_axis(int(s.attrs.get("axis", 0)), rank)).output(0)  # type: ignore[arg-type]


def _scatter_add(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    axis = normalize_axis(int(s.attrs.get("axis", 0)), rank)  # type: ignore[arg-type]
    return ops.scatter_elements_update(x[0], x[1], x[2], _i64([axis]), "sum", True).output(0)


def _cumsum(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    axis = normalize_axis(int(s.attrs.get("axis", -1)), rank)  # type: ignore[arg-type]
    return ops.cumsum(x[0], ops.constant(np.int64(axis)), bool(s.attrs.get("exclusive", False)),
                      bool(s.attrs.get("reverse", False))).output(0)


def _iota(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    shape = ctx.shape(s.outputs[0])
    dt = ctx.dtype(s.outputs[0])
    axis = normalize_axis(int(s.attrs.get("axis", 0)), len(shape))  # type: ignore[arg-type]
    n = shape[axis]
    r = ops.range(ops.constant(np.int64(0)), ops.constant(np.int64(n)), ops.constant(np.int64(1)),
                  OV_TYPES[dt]).output(0)
    view = [1] * len(shape)
    view[axis] = n
    r = ops.reshape(r, _i64(view), False).output(0)
    return ops.broadcast(r, _i64(shape), "numpy").output(0)


def _conv2d(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    strides = [int(v) for v in s.attrs.get("strides", (1, 1))]  # type: ignore[union-attr]
    t, left, b, r = (int(v) for v in s.attrs.get("pads", (0, 0, 0, 0)))  # type: ignore[union-attr]
    dil = [int(v) for v in s.attrs.get("dilations", (1, 1))]  # type: ignore[union-attr]
    groups = int(s.attrs.get("groups", 1))  # type: ignore[arg-type]
    if groups == 1:
        return ops.convolution(x[0], x[1], strides, [t, left], [b, r], dil).output(0)
    o, ipg, kh, kw = ctx.shape(s.inputs[1])
    w = ops.reshape(x[1], _i64([groups, o // groups, ipg, kh, kw]), False).output(0)
    return ops.group_convolution(x[0], w, strides, [t, left], [b, r], dil).output(0)


def _where(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.select(x[0], x[1], x[2]).output(0)


def _recip(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.divide(_scalar_like(1.0, ctx.dtype(s.inputs[0])), x[0]).output(0)


def _rsqrt(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.divide(_scalar_like(1.0, ctx.dtype(s.inputs[0])), ops.sqrt(x[0])).output(0)


def _softmax(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    return ops.softmax(x[0], normalize_axis(int(s.attrs.get("axis", -1)), rank)).output(0)  # type: ignore[arg-type]


def _log_softmax(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    return ops.log_softmax(x[0], normalize_axis(int(s.attrs.get("axis", -1)), rank)).output(0)  # type: ignore[arg-type]


def _layer_norm(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    rank = len(ctx.shape(s.inputs[0]))
    axis = normalize_axis(int(s.attrs.get("axis", -1)), rank)  # type: ignore[arg-type]
    eps = float(s.attrs.get("eps", 1e-5))  # type: ignore[arg-type]
    y = ops.mvn(x[0], _i64(range(axis, rank)), True, eps, "inside_sqrt").output(0)
    return ops.add(ops.multiply(y, x[1]), x[2]).output(0)


def _gelu(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    # OpenVINO's Gelu gives NaN at +inf (the reference: +inf; at -inf both are NaN, -inf * 0). It
    # is claimed rather than left to the core's decomposition because OpenVINO's GeluFusion pass
    # turns that decomposition back into this op.
    mode = "tanh" if s.attrs.get("approximate", "none") == "tanh" else "erf"
    dt = ctx.dtype(s.inputs[0])
    r = ops.gelu(x[0], mode).output(0)
    pos_inf = ops.equal(x[0], _scalar_like(np.inf, dt)).output(0)
    neg_inf = ops.equal(x[0], _scalar_like(-np.inf, dt)).output(0)
    r = ops.select(pos_inf, x[0], r).output(0)
    return ops.select(neg_inf, _scalar_like(np.nan, dt), r).output(0)


def _relu(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    # The reference's max(x, 0) keeps NaN; OpenVINO's Relu is a max that drops it, and so would
    # where(x > 0, x, 0). where(x < 0, 0, x) passes NaN through.
    zero = _scalar_like(0.0, ctx.dtype(s.inputs[0]))
    return ops.select(ops.less(x[0], zero), zero, x[0]).output(0)


def _silu(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.multiply(x[0], ops.sigmoid(x[0])).output(0)


def _linear(ctx: Ctx, s: Step, x: list[Out]) -> Out:
    return ops.add(ops.matmul(x[0], x[1], False, True), x[2]).output(0)


#: op -> translation. The claims in :mod:`rlx_oneapi.plugin` are built from these keys.
RULES: dict[str, Translate] = {
    "add": _binary(ops.add), "sub": _binary(ops.subtract), "mul": _binary(ops.multiply),
    "div": _binary(ops.divide), "pow": _binary(ops.power),
    "maximum": _nan_aware(ops.maximum), "minimum": _nan_aware(ops.minimum),
    "equal": _binary(ops.equal), "not_equal": _binary(ops.not_equal),
    "greater": _ordered(ops.greater), "greater_equal": _ordered(ops.greater_equal),
    "less": _ordered(ops.less), "less_equal": _ordered(ops.less_equal),
    "logical_and": _binary(ops.logical_and), "logical_or": _binary(ops.logical_or),
    "logical_xor": _binary(ops.logical_xor), "logical_not": _unary(ops.logical_not),
    "abs": _unary(ops.abs), "neg": _unary(ops.negative), "exp": _nan_kept(ops.exp), "log": _unary(ops.log),
    "sqrt": _unary(ops.sqrt), "rsqrt": _rsqrt, "reciprocal": _recip, "sigmoid": _unary(ops.sigmoid),
    "tanh": _unary(ops.tanh), "erf": _unary(ops.erf), "sin": _unary(ops.sin), "cos": _unary(ops.cos),
    "floor": _unary(ops.floor), "ceil": _unary(ops.ceiling), "sign": _unary(ops.sign),
    "round": lambda ctx, s, x: ops.round(x[0], "half_to_even").output(0),
    "where": _where, "cast": _cast, "matmul": _matmul,
    "reduce_sum": _reduce(ops.reduce_sum), "reduce_mean": _reduce(ops.reduce_mean),
    "reduce_prod": _reduce(ops.reduce_prod),
    "reduce_max": _reduce(ops.reduce_max, nan_aware=True),
    "reduce_min": _reduce(ops.reduce_min, nan_aware=True),
    "reshape": _reshape, "expand": _expand, "transpose": _transpose, "slice": _slice, "concat": _concat,
    "pad": _pad, "gather": _gather, "scatter_add": _scatter_add, "cumsum": _cumsum, "iota": _iota,
    "conv2d": _conv2d,
    "softmax": _softmax, "log_softmax": _log_softmax, "layer_norm": _layer_norm, "gelu": _gelu,
    "relu": _relu, "silu": _silu, "linear": _linear,
}


def build_model(program: Program) -> tuple[Any, list[str]]:
    """The OpenVINO model of ``program`` and the kernel names of its steps, in order.

    Parameters are the program's inputs in order, Results its outputs in order: names never reach
    OpenVINO (positions do), so any value name is safe."""
    g = program.graph
    ctx = Ctx(program)
    env: dict[str, Out] = {}
    params = []
    for v in program.inputs:
        p = ops.parameter(list(ctx.shape(v.name)), OV_TYPES[v.type.dtype])
        params.append(p)
        env[v.name] = p.output(0)
    for p in g.params:
        env[p.name] = _constant(np.asarray(g.weights[p.name]), g.types[p.name].dtype)
    kernels = []
    for s in program.kernels:
        rule = RULES.get(s.op)
        if rule is None:
            raise IRError(f"rlx-oneapi has no OpenVINO translation for {s.op!r}", where=f"node {s.node!r}",
                          fix="this is a bug in rlx-oneapi's claims: report it")
        out = rule(ctx, s, [env[i] for i in s.inputs])
        want = OV_TYPES[ctx.dtype(s.outputs[0])]
        if out.get_element_type() != want:  # e.g. argmax's i64 or a comparison's boolean
            out = ops.convert(out, want).output(0)
        shape = ctx.shape(s.outputs[0])
        if list(out.get_partial_shape().to_shape()) != list(shape):
            # Some OpenVINO ops give a rank-0 operand's result rank 1: keep the planned shape.
            out = ops.reshape(out, _i64(shape), False).output(0)
        env[s.outputs[0]] = out
        kernels.append(s.kernel)
    results = [ops.result(env[v]) for _, v in program.outputs]
    return ov.Model(results, params, "rlx"), kernels
