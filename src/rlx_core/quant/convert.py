"""Graph conversion: a float MLP/CNN becomes an INT8 graph (PTQ), or gets INT4 weight-only matmuls.

:func:`quantize_graph` keeps the graph's interface (same input and output names; float inputs are
quantized by a ``quantize`` node, quantized outputs are dequantized) and rewrites the body:

* ``linear`` / ``matmul`` with a weight parameter (+ ``add`` of a bias parameter) -> ``matmul_i8``
  (per-channel symmetric weights, int32 bias) + ``requantize`` (to the calibrated output range);
* ``conv2d_bias`` / ``conv2d`` (+ ``add`` of an (O, 1, 1) bias) -> ``conv2d_i8`` in NHWC (activations
  are transposed once, weights are stored OHWI) + ``requantize``;
* a ``relu`` (or ``maximum(x, 0)``) right after either is fused into the requantize clamp; a lone one
  becomes ``maximum(q, zero_point)``;
* ``max_pool2d`` / ``avg_pool2d`` -> ``max_pool2d_i8`` / ``avg_pool2d_i8`` (NHWC, same scale);
* ``reshape`` (flatten): an NHWC tensor flattened for a dense layer is not transposed back, the dense
  layer's weight columns are permuted instead; ``transpose`` runs on int8;
* ``softmax`` -> ``softmax_i8`` (or, with ``softmax="argmax"``, the class index of the logits);
  ``argmax`` runs on the int8 values (order is preserved).

Constant subgraphs (e.g. a reshaped bias) are folded first. Anything else is reported as a
:class:`~rlx_core.quant.schemes.QuantizationError` naming the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph, Node
from ..ir.types import normalize_axis
from .calibrate import Range, calibrate
from .fixedpoint import quantize_multipliers
from .schemes import (
    QuantizationError,
    activation_qparams,
    quantize_bias,
    quantize_int4_groups,
    quantize_weights_int8,
)

SUPPORTED = ("linear, matmul (+ add bias), conv2d_bias, conv2d (+ add bias), relu, maximum(x, 0), "
             "max_pool2d, avg_pool2d, reshape, transpose, softmax, argmax")
F32, I8 = DType.F32, DType.I8


@dataclass(frozen=True)
class QTensor:
    """An int8 value of the new graph: ``real = scale * (q - zero_point)``.

    ``layout``: ``plain`` (same axes as the float value), ``nhwc`` (a rank-4 value whose float
    counterpart is NCHW) or ``flat_nhwc`` (an NHWC tensor flattened; ``chw`` is the float shape).
    """

    t: Tensor
    scale: float
    zero_point: int
    layout: str = "plain"
    chw: tuple[int, int, int] | None = None


def _fold_constants(graph: Graph) -> tuple[dict[str, np.ndarray], set[str]]:
    """Weights plus the values of nodes computed from weights only (the core folding pass's values,
    outputs included and without a budget: the converter reads them, it does not keep them)."""
    from ..fold import constant_values

    consts, folded = constant_values(graph, outputs=True)
    return consts, set(folded)


class _Converter:
    def __init__(self, graph: Graph, ranges: Mapping[str, Range], *, per_channel: bool, symmetric: bool,
                 softmax: str, dequantize_outputs: bool, name: str) -> None:
        self.g = graph
        self.ranges = ranges
        self.per_channel = per_channel
        self.symmetric = symmetric
        self.softmax = softmax
        self.dequantize_outputs = dequantize_outputs
        self.consts, self.done = _fold_constants(graph)
        self.b = GraphBuilder(name, prefix="q_")
        self.floats: dict[str, Tensor] = {}
        self.q: dict[str, QTensor] = {}
        self.other: dict[str, Tensor] = {}
        self.outputs = set(graph.outputs)

    # -- helpers ---------------------------------------------------------------------------------
    def fail(self, node: Node, why: str) -> QuantizationError:
        return QuantizationError(f"cannot quantize {node.op}: {why}", where=node.where,
                                 fix=f"quantize_graph supports {SUPPORTED}")

    def qparams(self, value: str) -> tuple[float, int]:
        r = self.ranges.get(value)
        if r is None:
            raise QuantizationError(f"value {value!r} has no calibrated range",
                                    fix="calibrate the graph that is being quantized")
        return activation_qparams(r.lo, r.hi, symmetric=self.symmetric)

    def param(self, base: str, arr: np.ndarray) -> Tensor:
        return self.b.param(self.b.fresh(base.replace(":", "_")), arr)

    def sole(self, value: str) -> Node | None:
        return self.g.sole_reader(value)

    def output_chain(self, value: str) -> str | None:
        """The graph output ``value`` reaches through identity reshapes (output renames) and nothing
        else, if any; those reshapes are then consumed."""
        chain = []
        while value not in self.outputs:
            c = self.sole(value)
            if c is None or c.op != "reshape" or \
                    self.g.types[c.outputs[0]].shape != self.g.types[value].shape:
                return None
            chain.append(c)
            value = c.outputs[0]
        if self.g.consumers.get(value):
            return None
        self.done.update(c.name for c in chain)
        return value

    def is_zero(self, value: str) -> bool:
        return value in self.consts and not np.any(self.consts[value])

    def relu_input(self, node: Node) -> str | None:
        if node.op == "relu":
            return node.inputs[0]
        if node.op == "maximum":
            a, c = node.inputs
            if self.is_zero(c) and a not in self.consts:
                return a
            if self.is_zero(a) and c not in self.consts:
                return c
        return None

    def as_q(self, value: str, node: Node) -> QTensor:
        if value in self.q:
            return self.q[value]
        if value in self.floats:
            x = self.floats[value]
            if x.dtype is not F32:
                raise self.fail(node, f"input {value!r} is {x.dtype}; only f32 inputs are quantized")
            s, zp = self.qparams(value)
            qt = QTensor(self.b.op("quantize", x, scale=s, zero_point=zp), s, zp)
            self.q[value] = qt
            return qt
        if value in self.consts:
            raise self.fail(node, f"operand {value!r} is a constant where an activation is expected")
        raise self.fail(node, f"operand {value!r} was not quantized (it comes from an unsupported op)")

    def nhwc(self, q: QTensor) -> QTensor:
        if q.layout == "nhwc":
            return q
        q = self.plain(q)
        n, c, h, w = q.t.shape
        t = (self.b.op("reshape", q.t, shape=(n, h, w, 1)) if c == 1 else
             self.b.op("transpose", q.t, perm=(0, 2, 3, 1)))
        return QTensor(t, q.scale, q.zero_point, "nhwc")

    def plain(self, q: QTensor) -> QTensor:
        if q.layout == "plain":
            return q
        if q.layout == "flat_nhwc":
            assert q.chw is not None
            fc, fh, fw = q.chw  # the float (C, H, W), static
            n = q.t.shape[0]
            t4 = QTensor(self.b.op("reshape", q.t, shape=(n, fh, fw, fc)), q.scale, q.zero_point, "nhwc")
            p = self.plain(t4)
            return QTensor(self.b.op("reshape", p.t, shape=(n, fc * fh * fw)), q.scale, q.zero_point)
        n, h, w, c = q.t.shape
        t = (self.b.op("reshape", q.t, shape=(n, 1, h, w)) if c == 1 else
             self.b.op("transpose", q.t, perm=(0, 3, 1, 2)))
        return QTensor(t, q.scale, q.zero_point)

    def fuse_tail(self, value: str, bias_ok: Any) -> tuple[str, np.ndarray | None, bool]:
        """Follow a sole ``add`` of a bias constant and a sole ReLU after ``value``."""
        bias = None
        c = self.sole(value)
        if c is not None and c.op == "add":
            other = c.inputs[1] if c.inputs[0] == value else c.inputs[0]
            if other in self.consts and c.inputs.count(value) == 1:
                b = bias_ok(self.consts[other])
                if b is not None:
                    bias, value = b, c.outputs[0]
                    self.done.add(c.name)
        relu = False
        c = self.sole(value)
        if c is not None and self.relu_input(c) == value:
            relu, value = True, c.outputs[0]
            self.done.add(c.name)
        return value, bias, relu

    def requantized(self, acc: Tensor, x: QTensor, w_scales: np.ndarray, out: str, relu: bool,
                    base: str, layout: str) -> QTensor:
        s_y, zp_y = self.qparams(out)
        real = np.float64(x.scale) * w_scales.astype(np.float64) / np.float64(s_y)
        mult, shift = quantize_multipliers(real)
        y = self.b.op("requantize", acc, self.param(f"{base}_multiplier", mult),
                      self.param(f"{base}_shift", shift), zero_point=zp_y,
                      act_min=zp_y if relu else -128, act_max=127)
        return QTensor(y, s_y, zp_y, layout)

    def wq(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int8 weights, symmetric per output channel (axis 0) or per tensor."""
        return quantize_weights_int8(w, axis=0 if self.per_channel else None)

    # -- ops ---------------------------------------------------------------------------------------
    def dense(self, node: Node) -> None:
        if node.op == "linear":
            x, w, b = node.inputs
            if w not in self.consts or b not in self.consts:
                raise self.fail(node, "the weight and bias must be parameters")
            wf = self.consts[w].astype(np.float64)
            bf: np.ndarray | None = self.consts[b].astype(np.float64)
            out, _, relu = self.fuse_tail(node.outputs[0], lambda a: None)
        else:
            x, w = node.inputs
            wf = self.consts[w].astype(np.float64).T
            n = wf.shape[0]

            def bias_ok(a: np.ndarray) -> np.ndarray | None:
                ok = a.size == n and a.ndim >= 1 and a.shape[-1] == n
                return a.astype(np.float64).reshape(n) if ok else None
            out, bf, relu = self.fuse_tail(node.outputs[0], bias_ok)
        name = w
        n, k = wf.shape
        qx = self.as_q(x, node)
        if qx.layout == "flat_nhwc" and qx.chw is not None:
            c, h, wd = qx.chw
            wf = wf.reshape(n, c, h, wd).transpose(0, 2, 3, 1).reshape(n, k)
        elif qx.layout != "plain":
            qx = self.plain(qx)
        wq, ws = self.wq(wf)
        w_scales = np.broadcast_to(ws, (n,)) if ws.ndim == 0 else ws
        bq = quantize_bias(bf if bf is not None else np.zeros(n), qx.scale, w_scales)
        acc = self.b.op("matmul_i8", qx.t, self.param(f"{name}_q", wq), self.param(f"{name}_bias_q", bq),
                        x_zero_point=qx.zero_point)
        self.q[out] = self.requantized(acc, qx, ws, out, relu, name, "plain")

    def conv(self, node: Node) -> None:
        x, w = node.inputs[0], node.inputs[1]
        if w not in self.consts:
            raise self.fail(node, "the weight must be a parameter")
        wf = self.consts[w].astype(np.float64)  # OIHW
        o = wf.shape[0]
        if node.op == "conv2d_bias":
            if node.inputs[2] not in self.consts:
                raise self.fail(node, "the bias must be a parameter")
            bf: np.ndarray | None = self.consts[node.inputs[2]].astype(np.float64).reshape(o)
            out, _, relu = self.fuse_tail(node.outputs[0], lambda a: None)
        else:
            def bias_ok(a: np.ndarray) -> np.ndarray | None:
                ok = a.size == o and a.ndim >= 3 and a.shape[-3] == o
                return a.astype(np.float64).reshape(o) if ok else None
            out, bf, relu = self.fuse_tail(node.outputs[0], bias_ok)
        qx = self.nhwc(self.as_q(x, node))
        wq, ws = self.wq(wf.transpose(0, 2, 3, 1))  # OHWI
        w_scales = np.broadcast_to(ws, (o,)) if ws.ndim == 0 else ws
        bq = quantize_bias(bf if bf is not None else np.zeros(o), qx.scale, w_scales)
        a = node.attrs
        acc = self.b.op("conv2d_i8", qx.t, self.param(f"{w}_q", wq), self.param(f"{w}_bias_q", bq),
                        strides=a["strides"], pads=a["pads"], dilations=a["dilations"], groups=a["groups"],
                        x_zero_point=qx.zero_point)
        self.q[out] = self.requantized(acc, qx, ws, out, relu, w, "nhwc")

    def reshape(self, node: Node) -> None:
        q = self.as_q(node.inputs[0], node)
        out = node.outputs[0]
        shape = node.attrs["shape"]
        src, dst = self.g.types[node.inputs[0]].shape, self.g.types[out].shape
        if q.layout == "nhwc" and len(dst) == 2 and dst[0] == src[0]:
            consumers = self.g.consumers.get(out, ())
            dense = consumers and out not in self.outputs and all(
                c.op in ("linear", "matmul") and c.inputs[0] == out and c.inputs[1] in self.consts
                for c in consumers)
            if dense:
                _, c, h, w = src
                t = self.b.op("reshape", q.t, shape=shape)
                self.q[out] = QTensor(t, q.scale, q.zero_point, "flat_nhwc", (c, h, w))  # type: ignore[arg-type]
                return
        if q.layout == "flat_nhwc" and tuple(dst) == tuple(src):
            self.q[out] = QTensor(self.b.op("reshape", q.t, shape=shape), q.scale, q.zero_point,
                                  "flat_nhwc", q.chw)
            return
        q = self.plain(q)
        self.q[out] = QTensor(self.b.op("reshape", q.t, shape=shape), q.scale, q.zero_point)

    def convert(self) -> Graph:
        for v in self.g.inputs:
            self.floats[v.name] = self.b.input(v.name, v.type.dtype, v.type.shape)
        for node in self.g.nodes:
            if node.name in self.done:
                continue
            op, out = node.op, node.outputs[0]
            relu_of = self.relu_input(node)
            dense_matmul = (op == "matmul" and node.inputs[1] in self.consts
                            and node.inputs[0] not in self.consts and self.consts[node.inputs[1]].ndim == 2)
            if op == "linear" or dense_matmul:
                self.dense(node)
            elif op in ("conv2d_bias", "conv2d"):
                self.conv(node)
            elif relu_of is not None:
                q = self.as_q(relu_of, node)
                zp = self.b.const(np.int8(q.zero_point), I8)
                self.q[out] = QTensor(self.b.op("maximum", q.t, zp), q.scale, q.zero_point, q.layout, q.chw)
            elif op in ("max_pool2d", "avg_pool2d"):
                a = node.attrs
                if op == "avg_pool2d" and a["count_include_pad"] and any(a["pads"]):  # type: ignore[arg-type]
                    raise self.fail(node, "padded average pooling must exclude the padding "
                                          "(count_include_pad=False), as TFLite does")
                q = self.nhwc(self.as_q(node.inputs[0], node))
                t = self.b.op(f"{op}_i8", q.t, kernel=a["kernel"], strides=a["strides"], pads=a["pads"])
                self.q[out] = QTensor(t, q.scale, q.zero_point, "nhwc")
            elif op == "reshape":
                self.reshape(node)
            elif op == "transpose":
                q = self.plain(self.as_q(node.inputs[0], node))
                self.q[out] = QTensor(self.b.op("transpose", q.t, perm=node.attrs["perm"]), q.scale,
                                      q.zero_point)
            elif op == "softmax":
                q = self.plain(self.as_q(node.inputs[0], node))
                ax = normalize_axis(int(node.attrs["axis"]), q.t.rank)  # type: ignore[arg-type]
                final = self.output_chain(out) if self.softmax == "argmax" else None
                if final is not None:
                    self.other[final] = self.b.op("argmax", q.t, axis=ax)
                else:
                    self.q[out] = QTensor(self.b.op("softmax_i8", q.t, scale=q.scale, axis=ax), 1.0 / 256.0,
                                          -128)
            elif op == "argmax":
                q = self.plain(self.as_q(node.inputs[0], node))
                self.other[out] = self.b.op("argmax", q.t, axis=node.attrs["axis"],
                                            keepdims=node.attrs["keepdims"])
            else:
                raise self.fail(node, "no int8 rule for this op")
        for o in self.g.outputs:
            if o in self.q:
                q = self.plain(self.q[o])
                if self.dequantize_outputs:
                    self.b.output(self.b.op("dequantize", q.t, scale=q.scale, zero_point=q.zero_point,
                                            name=o))
                else:
                    self.b.output(q.t, o)
            elif o in self.other:
                self.b.output(self.other[o], o)
            elif o in self.floats:
                self.b.output(self.floats[o], o)
            else:
                raise QuantizationError(f"graph output {o!r} is a constant", fix="output activations")
        return self.b.build()


def quantize_graph(graph: Graph, calib_inputs: Any = None, *, method: str = "maxabs",
                   percentile: float = 99.99, per_channel: bool = True, symmetric_activations: bool = False,
                   softmax: str = "int8", dequantize_outputs: bool = True,
                   ranges: Mapping[str, Range] | None = None, name: str | None = None,
                   batch_size: int = 256, session: Any = None) -> Graph:
    """Post-training INT8 quantization of a float MLP/CNN (see the module docstring).

    ``calib_inputs``: sample inputs (``{input name: array}``, batched along axis 0, or an iterable
    of feeds) from which every activation's range is measured with ``method`` (``maxabs``,
    ``percentile`` or ``minmax``; see :mod:`rlx_core.quant.calibrate`), unless ``ranges`` is given.
    Weights are symmetric int8 per output channel (``per_channel=False``: per tensor); activations
    asymmetric int8 (``symmetric_activations=True``: zero point 0). ``softmax="int8"`` turns a
    softmax into ``softmax_i8``; ``"argmax"`` replaces a softmax *output* by the class index (i64).
    Quantized outputs are dequantized to f32 unless ``dequantize_outputs=False``.
    """
    if softmax not in ("int8", "argmax"):
        raise QuantizationError(f"softmax={softmax!r}", fix="use 'int8' or 'argmax'")
    if ranges is None:
        if calib_inputs is None:
            raise QuantizationError("no calibration data", fix="pass calib_inputs={input: samples}")
        ranges = calibrate(graph, calib_inputs, method=method, percentile=percentile, batch_size=batch_size,
                           session=session)
    conv = _Converter(graph, ranges, per_channel=per_channel, symmetric=symmetric_activations,
                      softmax=softmax, dequantize_outputs=dequantize_outputs,
                      name=name or f"{graph.name}_int8")
    return conv.convert()


def quantize_weights_int4(graph: Graph, *, group_size: int = 32, min_elements: int = 0) -> Graph:
    """INT4 weight-only quantization: every 2-D weight of a ``matmul`` (as ``x @ W``) or ``linear``
    becomes ``dequantize_int4(packed, scales)``; activations and arithmetic stay float.

    Weights whose K is not a multiple of ``group_size`` (or with fewer than ``min_elements``
    elements) are left in float.
    """
    b = GraphBuilder(f"{graph.name}_int4")
    env: dict[str, Tensor] = {}
    for v in graph.inputs:
        env[v.name] = b.input(v.name, v.type.dtype, v.type.shape)
    targets: dict[str, bool] = {}  # weight name -> stored transposed (matmul rhs)
    for n in graph.nodes:
        if n.op == "matmul" and n.inputs[1] in graph.weights:
            targets.setdefault(n.inputs[1], True)
        elif n.op == "linear" and n.inputs[1] in graph.weights:
            targets.setdefault(n.inputs[1], False)
    for p in graph.params:
        w = np.asarray(graph.weights[p.name])
        rhs = targets.get(p.name)
        if (rhs is None or w.ndim != 2 or w.dtype != np.float32 or w.size < min_elements):
            env[p.name] = b.param(p.name, w)
            continue
        wnk = w.T if rhs else w
        if wnk.shape[1] % group_size or wnk.shape[1] % 2:
            env[p.name] = b.param(p.name, w)
            continue
        packed, scales = quantize_int4_groups(wnk, group_size)
        deq = b.op("dequantize_int4", b.param(f"{p.name}_int4", packed), b.param(f"{p.name}_scales", scales),
                   group_size=group_size, name=f"{p.name}_dequantized")
        env[p.name] = b.op("transpose", deq, perm=(1, 0), name=f"{p.name}_t") if rhs else deq
    for n in graph.nodes:
        # A single-output node's value keeps its name (a named graph output is a value name).
        res = b.op(n.op, *[env[i] for i in n.inputs], name=n.outputs[0] if len(n.outputs) == 1 else n.name,
                   **dict(n.attrs))
        for o, t in zip(n.outputs, res if isinstance(res, tuple) else (res,)):
            env[o] = t
    for o in graph.outputs:
        b._outputs.append(env[o].name)
    return b.build()
