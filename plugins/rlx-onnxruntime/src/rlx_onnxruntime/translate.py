"""RLX ops as ONNX nodes (opset :data:`OPSET`), one translator per op.

A translator gets the node's input/output ONNX value names, its input/output types and attributes,
and appends nodes (and constants) to a :class:`OnnxGraph` so the node's outputs end up under the
given output names. It raises :class:`Untranslatable` for anything it does not honour exactly
(bf16, complex, an attribute it has no ONNX equivalent for): that reason becomes the claim's
rejection text, so the dispatcher decomposes the node or refuses it.

Every ONNX name is generated here (``x0``, ``t12``, ``n3``): names from the model never reach the
ONNX graph, so a hostile value name cannot collide with or inject into anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_core.plugin import Attrs, DType, TensorType, slice_params

#: Opset 20: reductions take axes as an input (18), Gelu exists (20), LayerNormalization (17).
OPSET = 20
#: ONNX IR version 9 goes with opset 20 and is read by every ONNX Runtime >= 1.15.
IR_VERSION = 9

ONNX_DTYPE: dict[DType, int] = {
    DType.F16: TensorProto.FLOAT16, DType.BF16: TensorProto.BFLOAT16, DType.F32: TensorProto.FLOAT,
    DType.F64: TensorProto.DOUBLE,
    DType.I8: TensorProto.INT8, DType.I16: TensorProto.INT16, DType.I32: TensorProto.INT32,
    DType.I64: TensorProto.INT64, DType.U8: TensorProto.UINT8, DType.BOOL: TensorProto.BOOL,
}
INT64_MIN = -(2**63)


class Untranslatable(Exception):
    """This variant has no exact ONNX translation here (the message says why)."""


class OnnxGraph:
    """Nodes, constants and generated names of one ONNX graph under construction."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._n = 0

    def fresh(self, prefix: str = "t") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array: np.ndarray) -> str:
        name = self.fresh("c")
        # np.ascontiguousarray would turn a rank-0 array into rank 1; copy(order="C") keeps it.
        self.initializers.append(numpy_helper.from_array(np.asarray(array).copy(order="C"), name))
        return name

    def i64(self, values: Sequence[int] | int) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | None = None,
             **attrs: Any) -> str:
        """Append one node; its (first) output name is returned (fresh unless ``outputs`` given)."""
        outs = list(outputs) if outputs is not None else [self.fresh()]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh("n"), **attrs))
        return outs[0]


Translator = Callable[[OnnxGraph, list[str], list[str], Sequence[TensorType], Sequence[TensorType],
                       Mapping[str, Any]], None]

UNARY = {"neg": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
         "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tanh": "Tanh",
         "sigmoid": "Sigmoid", "erf": "Erf", "floor": "Floor", "ceil": "Ceil", "round": "Round",
         "logical_not": "Not", "relu": "Relu"}
BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "pow": "Pow", "maximum": "Max",
          "minimum": "Min", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
          "equal": "Equal", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
          "greater_equal": "GreaterOrEqual"}
REDUCE = {"reduce_sum": "ReduceSum", "reduce_prod": "ReduceProd", "reduce_mean": "ReduceMean",
          "reduce_max": "ReduceMax", "reduce_min": "ReduceMin"}


def _shape(t: TensorType) -> list[int]:
    dims = list(t.shape)
    if any(not isinstance(d, int) for d in dims):
        raise Untranslatable(f"symbolic shape {t.shape} (programs are specialised before compiling)")
    return [int(d) for d in dims]


def _scalar(g: OnnxGraph, value: float | int | bool, dtype: DType) -> str:
    return g.const(np.asarray(value).astype(dtype.np))


def _unary(op: str) -> Translator:
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        g.node(op, ins, outs)
    return tr


def _binary(op: str) -> Translator:
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        g.node(op, ins, outs)
    return tr


def _nan_either(g: OnnxGraph, a: str, b: str) -> str:
    return g.node("Or", [g.node("IsNaN", [a]), g.node("IsNaN", [b])])


def _extreme(op: str) -> Translator:
    """maximum/minimum propagate NaN (IEEE maximum); ONNX Max/Min leave that unspecified, so a NaN
    operand is routed through explicitly: where(isnan(a) | isnan(b), a + b, Max(a, b))."""
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        if not it[0].dtype.is_float:
            g.node(op, ins, outs)
            return
        a, b = ins
        g.node("Where", [_nan_either(g, a, b), g.node("Add", [a, b]), g.node(op, [a, b])], outs)
    return tr


def _relu(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    x = ins[0]
    # Relu's NaN behaviour is unspecified in ONNX; RLX's relu propagates NaN.
    g.node("Where", [g.node("IsNaN", [x]), x, g.node("Relu", [x])], outs)


def _sign(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    if it[0].dtype in (DType.F16, DType.BF16):
        raise Untranslatable(f"{it[0].dtype} sign: ONNX Runtime's CPU kernel maps NaN to 0")
    g.node("Sign", ins, outs)


def _rsqrt(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Reciprocal", [g.node("Sqrt", ins)], outs)


def _not_equal(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
               ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Not", [g.node("Equal", ins)], outs)


def _div(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
         ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    dt = it[0].dtype
    if not dt.is_int:
        g.node("Div", ins, outs)
        return
    # RLX integer division: C truncation, a zero divisor gives 0, INT_MIN / -1 wraps to INT_MIN.
    # ONNX Runtime's integer Div is the C operator, which traps on both; so the divisor is made
    # safe first and the two special cases are selected afterwards.
    a, b = ins
    zero, one = _scalar(g, 0, dt), _scalar(g, 1, dt)
    is_zero = g.node("Equal", [b, zero])
    bad = is_zero
    if dt.is_signed:
        is_m1 = g.node("Equal", [b, _scalar(g, -1, dt)])
        bad = g.node("Or", [is_zero, is_m1])
    q = g.node("Div", [a, g.node("Where", [bad, one, b])])
    if dt.is_signed:
        # 0 - a wraps for INT_MIN like the reference (Neg would too, but Sub has every int kernel).
        q = g.node("Where", [is_m1, g.node("Sub", [zero, a]), q])
    g.node("Where", [is_zero, zero, q], outs)


def _cast(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Cast", ins, outs, to=ONNX_DTYPE[ot[0].dtype])


def _where(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Where", ins, outs)


def _reduce(op: str) -> Translator:
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        axes = attrs.get("axes")
        keep = int(bool(attrs.get("keepdims", False)))
        rank = it[0].rank
        if axes is not None and len(axes) == 0:
            g.node("Identity", ins, outs)  # reducing over no axis is the identity
            return
        if axes is None:
            axes = tuple(range(rank))
        if rank == 0:
            g.node("Identity", ins, outs)
            return
        axes = sorted({a % rank for a in axes})
        shape = _shape(it[0])
        count = int(np.prod([shape[a] for a in axes]))
        dt = it[0].dtype
        if op == "ReduceMean" and count == 0:
            # The mean of nothing is 0/0 = NaN in the reference; ORT's ReduceMean gives 0.
            total = g.node("ReduceSum", [ins[0], g.i64(axes)], keepdims=keep)
            g.node("Div", [total, _scalar(g, 0, dt)], outs)
            return
        if dt.is_int and op == "ReduceSum":
            _int_sum(g, ins[0], outs[0], shape, axes, _shape(ot[0]), dt)
            return
        if dt.is_int and op == "ReduceProd":
            raise Untranslatable("integer reduce_prod: ONNX Runtime saturates on overflow, RLX wraps")
        g.node(op, [ins[0], g.i64(axes)], outs, keepdims=keep)
    return tr


def _int_sum(g: OnnxGraph, x: str, out: str, shape: list[int], axes: list[int], oshape: list[int],
             dt: DType) -> None:
    """Integer sums must wrap like the reference; ORT's integer ReduceSum accumulates through
    double (and saturates), so the sum is a wrapping CumSum per axis, keeping its last element."""
    if any(shape[a] == 0 for a in axes):
        g.node("Expand", [_scalar(g, 0, dt), g.i64(oshape)], [out])
        return
    for a in axes:
        x = g.node("CumSum", [x, g.i64(a)])
        x = g.node("Slice", [x, g.i64([shape[a] - 1]), g.i64([shape[a]]), g.i64([a])])
    g.node("Reshape", [x, g.i64(oshape)], [out], allowzero=1)


def _arg(op: str) -> Translator:
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        if it[0].rank == 0:
            raise Untranslatable("argmax/argmin of a rank-0 tensor")
        g.node(op, ins, outs, axis=int(attrs.get("axis", -1)) % it[0].rank,
               keepdims=int(bool(attrs.get("keepdims", False))), select_last_index=0)
    return tr


def _matmul(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("MatMul", ins, outs)


def _reshape(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
             ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    # The static output shape, with allowzero: a 0 is a zero-sized dim, not "copy the input's".
    g.node("Reshape", [ins[0], g.i64(_shape(ot[0]))], outs, allowzero=1)


def _transpose(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
               ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    rank = it[0].rank
    if rank == 0:
        g.node("Identity", ins, outs)
        return
    perm = attrs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) % rank for p in perm]
    g.node("Transpose", ins, outs, perm=perm)


def _expand(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Expand", [ins[0], g.i64(_shape(ot[0]))], outs)


def _slice(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    shape = _shape(it[0])
    starts, ends, axes, steps = [], [], [], []
    # Resolved exactly as the reference slices (rlx_core.plugin.slice_params), then written as
    # explicit in-range ONNX indices so ONNX's own clamping rules never come into play.
    for ax, sl in slice_params(attrs if isinstance(attrs, Attrs) else Attrs(attrs), shape):
        start, stop, step = sl.indices(shape[ax])
        if len(range(start, stop, step)) == 0:
            start, stop, step = 0, 0, 1
        elif stop < 0:  # a negative step running through index 0
            stop = INT64_MIN
        starts.append(start)
        ends.append(stop)
        axes.append(ax)
        steps.append(step)
    if not axes:
        g.node("Identity", ins, outs)
        return
    g.node("Slice", [ins[0], g.i64(starts), g.i64(ends), g.i64(axes), g.i64(steps)], outs)


def _concat(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Concat", ins, outs, axis=int(attrs["axis"]) % max(it[0].rank, 1))


def _pad(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
         ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    if it[0].rank == 0 or not any(attrs["pads"]):
        g.node("Identity", ins, outs)
        return
    # The fill value converted as the reference converts it (np.asarray(value).astype(dtype)).
    value = _scalar(g, float(attrs["value"]), it[0].dtype)
    g.node("Pad", [ins[0], g.i64([int(p) for p in attrs["pads"]]), value], outs, mode="constant")


def _gather(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    if it[0].rank == 0:
        raise Untranslatable("gather from a rank-0 tensor")
    g.node("Gather", ins, outs, axis=int(attrs.get("axis", 0)) % it[0].rank)


def _scatter_add(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
                 ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    if it[0].rank == 0:
        raise Untranslatable("scatter_add into a rank-0 tensor")
    g.node("ScatterElements", ins, outs, axis=int(attrs.get("axis", 0)) % it[0].rank,
           reduction="add")


def _iota(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    shape = _shape(ot[0])
    rank = len(shape)
    if rank == 0:
        raise Untranslatable("iota of a rank-0 shape")
    axis = int(attrs.get("axis", 0)) % rank
    # Range over the axis in i64 (Range has few kernels; the indices are exact in every target
    # dtype the reference produces), cast, then broadcast: the EP computes it, nothing is baked in.
    line = g.node("Range", [g.i64(0), g.i64(shape[axis]), g.i64(1)])
    line = g.node("Cast", [line], to=ONNX_DTYPE[ot[0].dtype])
    view = [1] * rank
    view[axis] = shape[axis]
    g.node("Expand", [g.node("Reshape", [line, g.i64(view)], allowzero=1), g.i64(shape)], outs)


def _conv2d(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    kshape = _shape(it[1])
    g.node("Conv", ins, outs, kernel_shape=kshape[2:], strides=[int(s) for s in attrs["strides"]],
           pads=[int(p) for p in attrs["pads"]], dilations=[int(d) for d in attrs["dilations"]],
           group=int(attrs["groups"]))


def _cumsum(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    rank = it[0].rank
    exclusive = int(bool(attrs.get("exclusive", False)))
    reverse = int(bool(attrs.get("reverse", False)))
    if rank == 0:  # as a one-element vector, so an exclusive scan gives 0 as the reference does
        one = g.node("CumSum", [g.node("Reshape", [ins[0], g.i64([1])]), g.i64(0)],
                     exclusive=exclusive, reverse=reverse)
        g.node("Reshape", [one, g.i64([])], outs)
        return
    g.node("CumSum", [ins[0], g.i64(int(attrs.get("axis", -1)) % rank)], outs, exclusive=exclusive,
           reverse=reverse)


# -- HIR ops ------------------------------------------------------------------------------------

def _linear(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
            ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    x, w, b = ins
    if it[0].rank == 2 and it[2].rank == 1:
        g.node("Gemm", [x, w, b], outs, transB=1)
        return
    g.node("Add", [g.node("MatMul", [x, g.node("Transpose", [w], perm=[1, 0])]), b], outs)


def _softmax(op: str) -> Translator:
    def tr(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
           ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
        if op == "LogSoftmax" and it[0].dtype == DType.F64:
            raise Untranslatable("f64 log_softmax: ONNX Runtime's CPU kernel loses NaN inputs")
        if it[0].rank == 0:
            raise Untranslatable("softmax of a rank-0 tensor")
        g.node(op, ins, outs, axis=int(attrs.get("axis", -1)) % it[0].rank)
    return tr


def _layer_norm(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
                ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    rank = it[0].rank
    if rank == 0:
        raise Untranslatable("layer_norm of a rank-0 tensor")
    if it[0].dtype == DType.F64:
        raise Untranslatable("f64 layer_norm: ONNX Runtime's LayerNormalization is not f64-accurate")
    g.node("LayerNormalization", ins, outs, axis=int(attrs.get("axis", -1)) % rank,
           epsilon=float(attrs.get("eps", 1e-5)))


def _gelu(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    approx = str(attrs.get("approximate", "none"))
    if approx not in ("none", "tanh"):
        raise Untranslatable(f"gelu approximate={approx!r}")
    g.node("Gelu", ins, outs, approximate=approx)


def _silu(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
          ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Mul", [ins[0], g.node("Sigmoid", ins)], outs)


def _embedding(g: OnnxGraph, ins: list[str], outs: list[str], it: Sequence[TensorType],
               ot: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    g.node("Gather", ins, outs, axis=0)


TRANSLATORS: dict[str, Translator] = {
    **{op: _unary(onnx_op) for op, onnx_op in UNARY.items()},
    **{op: _binary(onnx_op) for op, onnx_op in BINARY.items()},
    "maximum": _extreme("Max"), "minimum": _extreme("Min"), "relu": _relu,
    "rsqrt": _rsqrt, "sign": _sign, "not_equal": _not_equal, "div": _div, "cast": _cast, "where": _where,
    **{op: _reduce(onnx_op) for op, onnx_op in REDUCE.items()},
    "argmax": _arg("ArgMax"), "argmin": _arg("ArgMin"), "matmul": _matmul, "reshape": _reshape,
    "transpose": _transpose, "expand": _expand, "slice": _slice, "concat": _concat, "pad": _pad,
    "gather": _gather, "scatter_add": _scatter_add, "iota": _iota, "conv2d": _conv2d,
    "cumsum": _cumsum,
    "linear": _linear, "softmax": _softmax("Softmax"), "log_softmax": _softmax("LogSoftmax"),
    "layer_norm": _layer_norm, "gelu": _gelu, "silu": _silu, "embedding": _embedding,
}


def translate(g: OnnxGraph, op: str, ins: list[str], outs: list[str], in_types: Sequence[TensorType],
              out_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> None:
    """Append ``op``'s ONNX nodes; :class:`Untranslatable` when it has no exact translation."""
    fn = TRANSLATORS.get(op)
    if fn is None:
        raise Untranslatable(f"no ONNX translation for {op}")
    for t in (*in_types, *out_types):
        if t.dtype not in ONNX_DTYPE:
            raise Untranslatable(f"{t.dtype} tensors are not translated (no exact ONNX Runtime path)")
    fn(g, ins, outs, in_types, out_types, attrs)


def value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_DTYPE[t.dtype], _shape(t))


def model(g: OnnxGraph, inputs: Sequence[tuple[str, TensorType]],
          outputs: Sequence[tuple[str, TensorType]]) -> onnx.ModelProto:
    """The model; a bf16 output leaves it widened to f32 (exact), because ONNX Runtime's Python
    binding cannot hand a bf16 tensor to NumPy: :func:`host_output` narrows it back."""
    outs = []
    for n, t in outputs:
        if t.dtype == DType.BF16:
            wide = g.fresh("w")
            g.node("Cast", [n], [wide], to=TensorProto.FLOAT)
            outs.append(value_info(wide, TensorType(DType.F32, t.shape)))
        else:
            outs.append(value_info(n, t))
    graph = helper.make_graph(g.nodes, "rlx_program", [value_info(n, t) for n, t in inputs],
                              outs, initializer=g.initializers)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="rlx-onnxruntime")
    m.ir_version = IR_VERSION
    return m


def host_input(a: np.ndarray, t: TensorType) -> Any:
    """A NumPy input as ONNX Runtime takes it: bf16 as an OrtValue over the same 16-bit words."""
    import onnxruntime as ort

    arr = np.asarray(a, dtype=t.dtype.np)
    if not arr.flags.c_contiguous:  # np.ascontiguousarray would make rank 0 rank 1
        arr = arr.copy(order="C")
    if t.dtype == DType.BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16),
                                                               TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(arr)


def host_output(v: Any, t: TensorType) -> np.ndarray:
    """An output OrtValue as NumPy in the RLX dtype (bf16 came out widened to f32: exact)."""
    if t.dtype == DType.BF16:
        shape = _shape(t)
        if 0 in shape:  # an empty widened tensor comes back from ORT with a wrong shape
            return np.empty(shape, t.dtype.np)
        return np.asarray(v.numpy()).astype(t.dtype.np)
    return np.asarray(v.numpy())
