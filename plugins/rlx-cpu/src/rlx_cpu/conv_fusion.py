"""ResNet's conv tails as one op each, so oneDNN runs them as post-ops of the convolution.

``conv2d_bias -> relu`` becomes ``rlx_cpu.conv2d_bias_relu`` and ``conv2d_bias -> add(residual)
-> relu`` becomes ``rlx_cpu.conv2d_bias_add_relu``: oneDNN adds the residual (its sum post-op)
and clamps while each output tile is still in registers, instead of a fused elementwise kernel
reading and writing the whole output again (17 of ResNet-18's 20 convs). Both ops decompose back
into the core ops, and the rule's regions are applied only where rlx-cpu claims the new op (f32,
f64), so other backends and dtypes see the original graph.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    REGISTRY,
    Attrs,
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
    # f32/f64 only: the ops exist for rlx-cpu's claims; a half-precision decomposition would round
    # between the conv, the add and the ReLU, which the reference does not.
    common: dict[str, Any] = dict(reference=_reference, level="hir", category="conv",
                                  dtypes=(DType.F32, DType.F64),
                                  attrs=base.attrs, decompose=_decompose, flops=_flops, provider="rlx-cpu",
                                  differentiable=False, amp="low", accumulates=True,
                                  extra={"condition": _condition})
    # conv2d_bias's conformance cases fit the ReLU op; the residual op's need a 4th operand the
    # suite has no generator for yet (tests/test_cpu_conv.py checks it against float64).
    return (OpSchema(BIAS_RELU, ("x", "w", "b"), _infer(BIAS_RELU, 3), cases=cases,
                     doc="relu(conv2d_bias(x, w, b)): ReLU as a post-op of the convolution", **common),
            OpSchema(BIAS_ADD_RELU, ("x", "w", "b", "residual"), _infer(BIAS_ADD_RELU, 4),
                     doc="relu(conv2d_bias(x, w, b) + residual): a ResNet block's tail as post-ops",
                     **common))


def ops() -> list[OpSchema]:
    """The two ops, the same objects every call (a reloaded plugin registers them again)."""
    return list(_schemas())


def find_conv_tails(g: Any) -> list[Region]:
    """One region per ``conv2d_bias`` whose only reader is a ReLU, or an add (of a residual of
    the same type) whose only reader is a ReLU; the intermediate values must not be graph outputs."""
    cons = g.consumers
    outs = set(g.outputs)

    def sole_reader(v: str) -> Node | None:
        users = cons.get(v, ())
        return users[0] if v not in outs and len(users) == 1 else None

    regions: list[Region] = []
    for n in g.nodes:
        if n.op != "conv2d_bias":
            continue
        y = n.outputs[0]
        nxt = sole_reader(y)
        if nxt is None:
            continue
        if nxt.op == "relu":
            regions.append(Region((n.name, nxt.name), (Node(f"{n.name}/relu", BIAS_RELU, n.inputs,
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


RULE = FusionRule("rlx_cpu.conv_tails", find_conv_tails, stage="graph", provider="rlx-cpu",
                  doc="conv2d_bias [+ residual] + relu become one conv with oneDNN post-ops")


def k_conv2d_bias_relu(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Any:
    from .conv import k_conv2d_bias

    return k_conv2d_bias(ins, outs, attrs, residual=ins[3] if len(ins) == 4 else None, relu=True)
