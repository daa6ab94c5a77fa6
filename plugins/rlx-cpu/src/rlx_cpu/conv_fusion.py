"""ResNet's conv tails as one op each, so oneDNN runs them as post-ops of the convolution.

``conv2d_bias -> relu`` becomes ``rlx_cpu.conv2d_bias_relu`` and ``conv2d_bias -> add(residual)
-> relu`` becomes ``rlx_cpu.conv2d_bias_add_relu``: oneDNN adds the residual (its sum post-op)
and clamps while each output tile is still in registers, instead of a fused elementwise kernel
reading and writing the whole output again (17 of ResNet-18's 20 convs). ``conv2d_bias -> silu``,
or ``y * sigmoid(y)`` as ONNX exporters write it, becomes ``rlx_cpu.conv2d_bias_silu`` (oneDNN's
swish post-op: 49 of EfficientNet-B0's 81 convs), and HardSwish as exporters write it
(``y * min(max(y * alpha + beta, 0), 1)``) ``rlx_cpu.conv2d_bias_hardswish`` (18 of
MobileNetV3-Small's 52). Clip (ReLU6) is left out here (oneDNN's clip turns NaN into the lower
bound, where the core's maximum/minimum keep it); rlx_cpu.conv_chain applies it as a NumPy step on
the blocked buffer instead. The ops decompose back into the core ops, and
the rule's regions are applied only where rlx-cpu claims the new op (f32, f64), so other backends
and dtypes see the original graph.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    REGISTRY,
    Attrs,
    AttrSpec,
    DType,
    FusionRule,
    GraphBuilder,
    Node,
    OpSchema,
    Region,
    ShapeError,
    Tensor,
    TensorType,
)

BIAS_RELU = "rlx_cpu.conv2d_bias_relu"
BIAS_ADD_RELU = "rlx_cpu.conv2d_bias_add_relu"
BIAS_SILU = "rlx_cpu.conv2d_bias_silu"
BIAS_HARDSWISH = "rlx_cpu.conv2d_bias_hardswish"
BIAS_NHWC = "rlx_cpu.conv2d_bias_nhwc"
#: The transpose a conv's output takes to channels-last (ConvNeXt's blocks and LayerNorm2d).
_TO_NHWC = (0, 2, 3, 1)


def _conv_bias() -> OpSchema:
    schema: OpSchema = REGISTRY.get("conv2d_bias")
    return schema


def _infer(name: str, arity: int) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        (out,) = _conv_bias().infer(ts[:3], attrs)
        if arity == 4 and (ts[3].dtype != out.dtype or ts[3].shape != out.shape):
            raise ShapeError(f"{name}: residual {ts[3]} must match the conv output {out}",
                             fix="pass a residual of the conv output's dtype and shape (no broadcasting)")
        return [out]
    return infer


def _reference(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    (y,) = _conv_bias().reference(xs[:3], attrs)
    if len(xs) == 4:
        y = y + xs[3]
    return [np.maximum(y, 0)]


def _decompose(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "groups")}
    y = g.op("conv2d_bias", *ins[:3], name=None, **conv)
    if len(ins) == 4:
        y = y + ins[3]
    return [g.op("relu", y, name=None)]


def _reference_silu(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    (y,) = _conv_bias().reference(xs[:3], attrs)
    return list(REGISTRY.get("silu").reference([y], Attrs({})))


def _decompose_silu(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "groups")}
    y = g.op("conv2d_bias", *ins[:3], name=None, **conv)
    return [g.op("silu", y, name=None)]


def _reference_hardswish(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    (y,) = _conv_bias().reference(xs[:3], attrs)
    return [y * np.minimum(np.maximum(y * attrs["alpha"] + attrs["beta"], 0.0), 1.0)]


def _decompose_hardswish(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "groups")}
    y = g.op("conv2d_bias", *ins[:3], name=None, **conv)
    dt = y.dtype
    t = g.op("maximum", y * g.const(attrs["alpha"], dt) + g.const(attrs["beta"], dt), g.const(0.0, dt))
    return [y * g.op("minimum", t, g.const(1.0, dt))]


def _infer_nhwc(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (out,) = _conv_bias().infer(ts[:3], attrs)
    return [TensorType(out.dtype, tuple(out.shape[i] for i in _TO_NHWC))]


def _reference_nhwc(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    (y,) = _conv_bias().reference(xs[:3], attrs)
    return [np.ascontiguousarray(np.transpose(y, _TO_NHWC))]


def _decompose_nhwc(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "groups")}
    y = g.op("conv2d_bias", *ins[:3], name=None, **conv)
    return [g.op("transpose", y, name=None, perm=_TO_NHWC)]


def _flops_silu(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    n = 1.0
    for d in outs[0].shape:
        n *= float(d) if isinstance(d, int) else 1.0
    return float(_conv_bias().flops(ins[:3], outs, attrs)) + 4 * n


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    n = 1.0
    for d in outs[0].shape:
        n *= float(d) if isinstance(d, int) else 1.0
    return float(_conv_bias().flops(ins[:3], outs, attrs)) + (len(ins) - 2) * n


def _condition(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    """The conformance tolerance: (terms summed per output, their magnitude): the conv's
    ``ci*kh*kw`` products, the bias and the residual, evaluated on ``|inputs|``."""
    a = [np.where(np.isfinite(v), np.abs(np.asarray(v, np.float64)), 0.0) for v in xs]
    _, cg, kh, kw = a[1].shape
    (mag,) = _conv_bias().reference(a[:3], attrs)
    if len(a) == 4:
        mag = mag + a[3]
    return cg * kh * kw + len(a) - 2, float(mag.max()) if mag.size else 0.0


@functools.cache
def _schemas() -> tuple[OpSchema, ...]:
    from dataclasses import replace

    base = _conv_bias()
    # A CaseSpec (not exported by rlx_core.plugin yet) made from a core op's: conv2d_bias's cases.
    spec = REGISTRY.get("add").cases
    cases = None if spec is None else replace(spec, family="conv2d_bias", domains=(), overflow=False)
    # conv2d_bias's cases with a residual operand (rlx_conformance.conv_cases).
    res_cases = None if spec is None else replace(spec, family="conv2d_bias_residual", domains=(),
                                                  overflow=False)
    # f32/f64 only: the ops exist for rlx-cpu's claims; a half-precision decomposition would round
    # between the conv, the add and the ReLU, which the reference does not.
    common: dict[str, Any] = dict(reference=_reference, level="hir", category="conv",
                                  dtypes=(DType.F32, DType.F64),
                                  attrs=base.attrs, decompose=_decompose, flops=_flops, provider="rlx-cpu",
                                  differentiable=False, amp="low", accumulates=True,
                                  extra={"condition": _condition})
    # conv2d_bias's conformance cases fit the ReLU op; the residual op's add a 4th operand.
    return (OpSchema(BIAS_RELU, ("x", "w", "b"), _infer(BIAS_RELU, 3), cases=cases,
                     doc="relu(conv2d_bias(x, w, b)): ReLU as a post-op of the convolution", **common),
            OpSchema(BIAS_ADD_RELU, ("x", "w", "b", "residual"), _infer(BIAS_ADD_RELU, 4),
                     cases=res_cases,
                     doc="relu(conv2d_bias(x, w, b) + residual): a ResNet block's tail as post-ops",
                     **common),
            OpSchema(BIAS_HARDSWISH, ("x", "w", "b"), _infer(BIAS_HARDSWISH, 3), cases=cases,
                     doc="y * min(max(alpha * y + beta, 0), 1) of y = conv2d_bias(x, w, b) (hardswish with "
                         "alpha 1/6, beta 1/2) as a post-op of the convolution",
                     **{**common, "reference": _reference_hardswish, "decompose": _decompose_hardswish,
                        "flops": _flops_silu,
                        "attrs": (*base.attrs, AttrSpec("alpha", "float", default=1 / 6),
                                  AttrSpec("beta", "float", default=0.5))}),
            OpSchema(BIAS_NHWC, ("x", "w", "b"), _infer_nhwc, cases=cases,
                     doc="transpose(conv2d_bias(x, w, b), (0, 2, 3, 1)): the conv writes its output "
                         "channels-last (oneDNN reads the strides), no transpose pass after it",
                     **{**common, "reference": _reference_nhwc, "decompose": _decompose_nhwc}),
            OpSchema(BIAS_SILU, ("x", "w", "b"), _infer(BIAS_SILU, 3), cases=cases,
                     doc="silu(conv2d_bias(x, w, b)): SiLU (x * sigmoid(x)) as a post-op of the convolution",
                     **{**common, "reference": _reference_silu, "decompose": _decompose_silu,
                        "flops": _flops_silu}))


def ops() -> list[OpSchema]:
    """The ops, the same objects every call (a reloaded plugin registers them again)."""
    return list(_schemas())


def find_conv_tails(g: Any) -> list[Region]:
    """One region per ``conv2d_bias`` whose only reader is a ReLU or a SiLU, or whose only readers
    are ``s = sigmoid(y)`` and ``y * s`` (SiLU) or the HardSwish chain, or whose only reader is an
    add (of a residual of the same type) whose only reader is a ReLU; the intermediate values must
    not be graph outputs."""
    sole_reader = g.sole_reader
    regions: list[Region] = []
    for n in g.nodes:
        if n.op != "conv2d_bias":
            continue
        y = n.outputs[0]
        swish = _sigmoid_mul(g, y, sole_reader)
        if swish is not None:  # y * sigmoid(y) as ONNX exporters write SiLU
            sig, mul = swish
            regions.append(Region((n.name, sig.name, mul.name),
                                  (Node(f"{n.name}/silu", BIAS_SILU, n.inputs, mul.outputs, n.attrs),)))
            continue
        hswish = _hardswish(g, y, sole_reader)
        if hswish is not None:
            members, out, alpha, beta = hswish
            regions.append(Region((n.name, *members), (Node(
                f"{n.name}/hardswish", BIAS_HARDSWISH, n.inputs, (out,),
                Attrs({**n.attrs, "alpha": alpha, "beta": beta})),)))
            continue
        nxt = sole_reader(y)
        if nxt is None:
            continue
        if nxt.op == "relu":
            regions.append(Region((n.name, nxt.name), (Node(f"{n.name}/relu", BIAS_RELU, n.inputs,
                                                            nxt.outputs, n.attrs),)))
            continue
        if nxt.op == "silu":
            regions.append(Region((n.name, nxt.name), (Node(f"{n.name}/silu", BIAS_SILU, n.inputs,
                                                            nxt.outputs, n.attrs),)))
            continue
        if nxt.op != "add" or len(nxt.inputs) != 2 or nxt.inputs[0] == nxt.inputs[1]:
            continue
        res = nxt.inputs[1] if nxt.inputs[0] == y else nxt.inputs[0]
        relu = sole_reader(nxt.outputs[0])
        if relu is None or relu.op != "relu" or g.types[res] != g.types[y]:
            continue
        regions.append(Region((n.name, nxt.name, relu.name),
                              (Node(f"{n.name}/add_relu", BIAS_ADD_RELU, (*n.inputs, res), relu.outputs,
                                    n.attrs),)))
    return regions


def _sigmoid_mul(g: Any, y: str, sole_reader: Any) -> tuple[Node, Node] | None:
    """(the sigmoid, the mul) where ``y``'s only readers are ``s = sigmoid(y)`` and ``y * s`` (either
    order) and ``s``'s only reader is that mul; None otherwise."""
    users = g.consumers.get(y, ())
    if y in g.outputs or len(users) != 2:
        return None
    sig = next((u for u in users if u.op == "sigmoid"), None)
    mul = next((u for u in users if u.op == "mul"), None)
    if sig is None or mul is None or len(mul.inputs) != 2:
        return None
    if sole_reader(sig.outputs[0]) is not mul or sorted(mul.inputs) != sorted((y, sig.outputs[0])):
        return None
    if g.types[mul.outputs[0]] != g.types[y]:  # no broadcasting through the mul
        return None
    return sig, mul


def _scalar(g: Any, v: str) -> float | None:
    """The value of a scalar constant, else None."""
    arr = g.weights.get(v)
    if arr is None or np.ndim(arr) != 0:
        return None
    return float(arr)


def _hardswish(g: Any, y: str, sole_reader: Any) -> tuple[tuple[str, ...], str, float, float] | None:
    """(the member nodes, the output, alpha, beta) where ``y``'s only readers are the chain
    ``min(max(y * alpha + beta, 0), 1)`` (scalar constants; the form ONNX exporters give HardSwish)
    and ``y * that``; None otherwise."""
    users = g.consumers.get(y, ())
    if y in g.outputs or len(users) != 2 or any(u.op != "mul" or len(u.inputs) != 2 for u in users):
        return None

    def other(node: Node, v: str) -> str | None:
        a, b = node.inputs
        return b if a == v else a if b == v else None

    for scale, final in (users, users[::-1]):
        alpha = _scalar(g, other(scale, y) or "")
        add = sole_reader(scale.outputs[0])
        if alpha is None or add is None or add.op != "add" or len(add.inputs) != 2:
            continue
        beta = _scalar(g, other(add, scale.outputs[0]) or "")
        mx = sole_reader(add.outputs[0])
        if beta is None or mx is None or mx.op != "maximum" or len(mx.inputs) != 2:
            continue
        mn = sole_reader(mx.outputs[0])
        if _scalar(g, other(mx, add.outputs[0]) or "") != 0.0 or mn is None or mn.op != "minimum" \
                or len(mn.inputs) != 2 or _scalar(g, other(mn, mx.outputs[0]) or "") != 1.0:
            continue
        if sole_reader(mn.outputs[0]) is not final or other(final, y) != mn.outputs[0] \
                or g.types[final.outputs[0]] != g.types[y]:
            continue
        return (scale.name, add.name, mx.name, mn.name, final.name), final.outputs[0], alpha, beta
    return None


RULE = FusionRule("rlx_cpu.conv_tails", find_conv_tails, stage="graph", provider="rlx-cpu",
                  doc="conv2d_bias [+ residual] + relu, and conv2d_bias + silu (or x * sigmoid(x)), become "
                      "one conv with oneDNN post-ops")


def k_conv2d_bias_relu(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from .conv import k_conv2d_bias

    return k_conv2d_bias(ins, outs, attrs, residual=ins[3] if len(ins) == 4 else None, act="relu")


def k_conv2d_bias_nhwc(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from .conv import k_conv2d_bias

    # The NHWC buffer seen as NCHW: every conv path writes through the view's strides.
    return k_conv2d_bias(ins, [outs[0].transpose(0, 3, 1, 2)], attrs)


def k_conv2d_bias_silu(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from .conv import k_conv2d_bias

    return k_conv2d_bias(ins, outs, attrs, act="silu")


def k_conv2d_bias_hardswish(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from .conv import k_conv2d_bias

    alpha, beta = attrs["alpha"], attrs["beta"]
    assert isinstance(alpha, float) and isinstance(beta, float)  # checked as "float" attributes
    return k_conv2d_bias(ins, outs, attrs, act=("hardswish", alpha, beta))


def find_nhwc_outputs(g: Any) -> list[Region]:
    """One region per ``conv2d_bias`` whose only reader is ``transpose(perm=(0, 2, 3, 1))`` (its value
    not a graph output): ConvNeXt's depthwise 7x7 convs and its stem feed a channels-last LayerNorm
    (a conv chain that ended in such a conv ends one conv earlier). oneDNN then writes the NHWC
    buffer itself and the transpose after it goes: convnext_tiny_cfg new/old 0.78 at b1, 0.81 at b8
    (``bench/onnx_zoo_ab.py``, docs/BENCHMARKS.md)."""
    regions: list[Region] = []
    for n in g.nodes:
        t = g.sole_reader(n.outputs[0]) if n.op == "conv2d_bias" else None
        if t is None or t.op != "transpose" or tuple(t.attrs.get("perm", ())) != _TO_NHWC:
            continue
        regions.append(Region((n.name, t.name), (Node(f"{n.name}/nhwc", BIAS_NHWC, n.inputs, t.outputs,
                                                      n.attrs),)))
    return regions


NHWC_RULE = FusionRule("rlx_cpu.conv_nhwc_outputs", find_nhwc_outputs, stage="graph", provider="rlx-cpu",
                       doc="conv2d_bias followed only by a transpose to channels-last becomes one conv "
                           "writing NHWC")
