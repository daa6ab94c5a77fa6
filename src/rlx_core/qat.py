"""Quantization-aware training (QAT): symmetric INT8 fake quantization with a straight-through
estimator.

``fake_quant(x, scale; qmin=-128, qmax=127)`` is an HIR op::

    forward:  y = round(clamp(x / scale, qmin, qmax)) * scale     (round half to even, as torch)
    backward: dy/dx passes where qmin <= x / scale <= qmax, else 0  (straight-through estimator)
              no gradient to ``scale`` (it is a statistic of the tensor, like torch's observers)

``scale`` is per tensor (a scalar) or anything that broadcasts to ``x`` (per channel: ``(out, 1)``
for an ``(out, in)`` weight). f16/bf16 operands are quantized in f32 (a half-precision ``x / scale``
can land on the wrong side of a rounding boundary). The op has inference, a float64 reference
and a decomposition into MIR (``reciprocal``, ``mul``, ``maximum``, ``minimum``, ``round``), so
every backend runs it and the conformance suite tests it like any registered op; its VJP (and JVP)
are registered with :mod:`rlx_core.autodiff`. Importing this module registers the op.

:func:`qat_model` inserts fake quantization on the weights and the input activations of every
``linear`` layer of a model graph: weight scales are ``max|w| / qmax`` computed in the graph from the
current weights each step (per tensor, or per output channel), activation scales either the same
dynamic statistic per batch or fixed values from :func:`calibrate_activation_scales`. Biases stay
float (an int8 deployment keeps them in int32 at scale ``s_x * s_w``, a negligible rounding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .autodiff.registry import register_jvp, register_vjp
from .dtypes import FLOAT_DTYPES, DType
from .errors import DTypeError, IRError, ShapeError
from .ir.builder import GraphBuilder, Tensor
from .ir.graph import Graph
from .ir.schema import REGISTRY, AttrSpec, OpSchema, register_op
from .ir.types import Attrs, TensorType, broadcast_shapes

FAKE_QUANT = "fake_quant"
INT8 = (-128, 127)
#: The smallest scale used (for all-zero tensors) when the dtype allows it; see :func:`_tiny`.
MIN_SCALE = 1e-12


def _infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, s = ts
    if x.dtype not in FLOAT_DTYPES:
        raise DTypeError(f"fake_quant: x is {x.dtype}, a float dtype is required",
                         fix="fake quantization simulates int8 on float tensors")
    if s.dtype != x.dtype:
        raise DTypeError(f"fake_quant: scale is {s.dtype} but x is {x.dtype}",
                         fix=f"cast the scale to {x.dtype}")
    try:
        out = broadcast_shapes(x.shape, s.shape)
    except Exception as e:
        raise ShapeError(f"fake_quant: scale {s.shape} does not broadcast to x {x.shape}",
                         fix="pass a scalar scale (per tensor) or one per channel, e.g. (out, 1)") from e
    if tuple(out) != tuple(x.shape):
        raise ShapeError(f"fake_quant: scale {s.shape} would broadcast x {x.shape} to {out}",
                         fix="the scale must broadcast to x's shape, not enlarge it")
    qmin, qmax = _levels(attrs)
    if qmin >= qmax:
        raise IRError(f"fake_quant: qmin {attrs['qmin']} must be below qmax {attrs['qmax']}",
                      fix="symmetric int8 is qmin=-128, qmax=127 (or -127 for a narrow range)")
    return [x]


def _levels(attrs: Attrs) -> tuple[int, int]:
    """``(qmin, qmax)``, ``int`` attributes (:meth:`OpSchema.check_attrs` has checked them)."""
    qmin, qmax = attrs["qmin"], attrs["qmax"]
    if not isinstance(qmin, int) or not isinstance(qmax, int):
        raise IRError(f"fake_quant: qmin {qmin!r} and qmax {qmax!r} must be ints", fix="pass integer levels")
    return qmin, qmax


def _reference(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, s = (np.asarray(a, np.float64) for a in xs)
    qmin, qmax = _levels(attrs)
    with np.errstate(all="ignore"):
        return [np.clip(np.rint(x / s), qmin, qmax) * s]


def _attrs(attrs: Mapping[str, Any]) -> Attrs:
    return REGISTRY.get(FAKE_QUANT).check_attrs(attrs, "fake_quant")


def _wide(g: GraphBuilder, t: Tensor) -> Tensor:
    """f16/bf16 operands are quantized in f32: one rounding of x / scale in half precision is
    enough to move a value across a rounding boundary and change its integer level."""
    return g.op("cast", t, to=DType.F32) if t.dtype in (DType.F16, DType.BF16) else t


def _decompose(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs(attrs)
    x, s = (_wide(g, t) for t in ins)
    dt = x.dtype
    # x * (1 / s): the reciprocal is one small op on the scale, and the x-sized chain that fuses
    # has no division (a fused division by an unwritten or zero scale must not trap in any backend).
    v = x * g.op("reciprocal", s)
    q = g.op("minimum", g.op("maximum", v, g.const(float(a["qmin"]), dt)),  # type: ignore[arg-type]
             g.const(float(a["qmax"]), dt))  # type: ignore[arg-type]
    y = g.op("round", q) * s
    return [y if y.dtype == ins[0].dtype else g.op("cast", y, to=ins[0].dtype)]


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return 5.0 * float(outs[0].numel())


SCHEMA = OpSchema(
    FAKE_QUANT, ("x", "scale"), _infer, _reference, level="hir", category="quantization",
    dtypes=FLOAT_DTYPES, flops=_flops, decompose=_decompose,
    attrs=(AttrSpec("qmin", "int", default=INT8[0], doc="smallest integer level (int8: -128)"),
           AttrSpec("qmax", "int", default=INT8[1], doc="largest integer level (int8: 127)")),
    doc="symmetric fake quantization round(clamp(x / scale, qmin, qmax)) * scale; scale broadcasts to "
        "x (per tensor or per channel); gradient: straight-through where not clipped")
register_op(SCHEMA)


def _pass_mask(b: GraphBuilder, x: Tensor, s: Tensor, attrs: Attrs) -> Tensor:
    a = _attrs(attrs)
    x, s = _wide(b, x), _wide(b, s)
    v = x * b.op("reciprocal", s)
    lo = b.op("greater_equal", v, b.const(float(a["qmin"]), x.dtype))  # type: ignore[arg-type]
    hi = b.op("less_equal", v, b.const(float(a["qmax"]), x.dtype))  # type: ignore[arg-type]
    return b.op("logical_and", lo, hi)


@register_vjp(FAKE_QUANT)
def _fake_quant_vjp(b: GraphBuilder, ins: Sequence[Tensor], outs: Sequence[Tensor],
                    cts: Sequence[Tensor | None], attrs: Attrs) -> list[Tensor | None]:
    g = cts[0]
    if g is None:
        return [None, None]
    x, s = ins
    return [b.op("where", _pass_mask(b, x, s, attrs), g, b.const(0.0, g.dtype)), None]


@register_jvp(FAKE_QUANT)
def _fake_quant_jvp(b: GraphBuilder, ins: Sequence[Tensor], outs: Sequence[Tensor],
                    ts: Sequence[Tensor | None], attrs: Attrs) -> list[Tensor | None]:
    t = ts[0]
    if t is None:
        return [None]
    x, s = ins
    return [b.op("where", _pass_mask(b, x, s, attrs), t, b.const(0.0, t.dtype))]


def fake_quant(b: GraphBuilder, x: Tensor, scale: Tensor | float, *, qmin: int = INT8[0],
               qmax: int = INT8[1]) -> Tensor:
    """``fake_quant`` of ``x`` (``scale`` a tensor or a Python float)."""
    s = scale if isinstance(scale, Tensor) else b.const(float(scale), x.dtype)
    return b.op(FAKE_QUANT, x, s, qmin=qmin, qmax=qmax)


def absmax_scale(b: GraphBuilder, x: Tensor, *, qmax: int = INT8[1], axis: int | None = None) -> Tensor:
    """``max|x| / qmax`` (per tensor, or per slice along ``axis`` kept as a broadcastable dim),
    floored at :data:`MIN_SCALE` so an all-zero tensor does not divide by zero."""
    axes = None if axis is None else tuple(i for i in range(x.rank) if i != axis % x.rank)
    m = b.op("reduce_max", b.op("abs", x), axes=axes, keepdims=axis is not None)
    floor = max(MIN_SCALE, _tiny(x.dtype)) * qmax
    return b.op("maximum", m, b.const(floor, x.dtype)) / b.const(float(qmax), x.dtype)


def _tiny(dt: Any) -> float:
    """The smallest normal number of ``dt`` (f16: 6.1e-5), so the floored scale never underflows."""
    try:
        return float(np.finfo(dt.np).tiny)
    except (TypeError, ValueError):
        import ml_dtypes

        return float(ml_dtypes.finfo(dt.np).tiny)


def qat_model(graph: Graph, *, weights: bool = True,
              activations: str | Mapping[str, float] | None = "dynamic", per_channel: bool = False,
              qmin: int = INT8[0], qmax: int = INT8[1],
              layers: Iterable[str] | None = None, name: str | None = None) -> Graph:
    """``graph`` with fake quantization on the weights and input activations of its ``linear``
    nodes (all, or the node names in ``layers``).

    ``activations``: ``"dynamic"`` (scale ``max|x| / qmax`` of each batch, computed in the graph),
    a mapping from linear node name to a fixed scale (see :func:`calibrate_activation_scales`), or
    ``None`` (weights only). ``per_channel`` gives each output row of a weight its own scale."""
    from .autodiff._util import ADBuilder

    chosen = set(layers) if layers is not None else None
    if isinstance(activations, str) and activations != "dynamic":
        raise IRError(f"activations={activations!r}", fix="use 'dynamic', a {node: scale} mapping, or None")
    reserved = set(graph.types) | {n.name for n in graph.nodes}
    b = ADBuilder(name or f"{graph.name}_qat", reserved)
    env: dict[str, Tensor] = {}
    for v in graph.inputs:
        env[v.name] = b.input(v.name, v.type.dtype, v.type.shape)
    for p in graph.params:
        env[p.name] = b.param(p.name, graph.weights[p.name], p.type.dtype)
    done = []
    for node in graph.nodes:
        ins = [env[i] for i in node.inputs]
        if node.op == "linear" and (chosen is None or node.name in chosen):
            x, w, bias = ins
            if activations is not None:
                if isinstance(activations, Mapping):
                    if node.name not in activations:
                        raise IRError(f"qat_model: no activation scale for linear node {node.name!r}",
                                      fix="calibrate every layer, or pass activations='dynamic'")
                    sx = b.const(float(activations[node.name]), x.dtype)
                else:
                    sx = absmax_scale(b, x, qmax=qmax)
                x = b.op(FAKE_QUANT, x, sx, qmin=qmin, qmax=qmax)
            if weights:
                sw = absmax_scale(b, w, qmax=qmax, axis=0 if per_channel else None)
                w = b.op(FAKE_QUANT, w, sw, qmin=qmin, qmax=qmax)
            ins = [x, w, bias]
            done.append(node.name)
        out = b.op(node.op, *ins, name=None, **dict(node.attrs))  # a fresh name; attrs never hold one
        env.update(zip(node.outputs, out if isinstance(out, tuple) else (out,)))
    if chosen is not None and (missing := sorted(chosen - set(done))):
        raise IRError(f"qat_model: {missing} are not linear nodes of graph {graph.name!r}",
                      fix="name linear nodes (see graph.nodes)")
    for o in graph.outputs:
        b.output(env[o], o)
    return b.build()


def calibrate_activation_scales(graph: Graph, feeds: Iterable[Mapping[str, Any]], *, qmax: int = INT8[1],
                                device: str | None = "cpu", session: Any = None) -> dict[str, float]:
    """Static activation scales: ``max|x| / qmax`` of each ``linear`` node's input over ``feeds``
    (batches of the graph's inputs), run on ``device``. Pass the result to :func:`qat_model`."""
    from .runtime import Session

    lin = [n for n in graph.nodes if n.op == "linear"]
    if not lin:
        return {}
    probe = Graph(graph.name, graph.inputs, graph.params, graph.nodes,
                  tuple(dict.fromkeys([*graph.outputs, *(n.inputs[0] for n in lin)])), dict(graph.weights))
    exe = (session or Session(device)).compile(probe)
    amax = {n.name: 0.0 for n in lin}
    for feed in feeds:
        out = exe.run(dict(feed))
        for n in lin:
            v = out[n.inputs[0]]
            amax[n.name] = max(amax[n.name], float(np.max(np.abs(v))) if v.size else 0.0)
    return {k: max(v, MIN_SCALE) / qmax for k, v in amax.items()}


def quantize_weights(graph: Graph, *, per_channel: bool = False, qmax: int = INT8[1],
                     qmin: int = INT8[0]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The int8 weights of every ``linear`` layer whose weight is a parameter, as a deployment
    would store them: ``{param: (int8 values, float32 scale)}`` with ``w ~= values * scale``."""
    out = {}
    for n in graph.nodes:
        if n.op != "linear" or n.inputs[1] not in graph.weights:
            continue
        w = np.asarray(graph.weights[n.inputs[1]], np.float64)
        amax = np.max(np.abs(w), axis=1, keepdims=True) if per_channel else np.max(np.abs(w))
        s = np.maximum(amax, MIN_SCALE) / qmax
        out[n.inputs[1]] = (np.clip(np.rint(w / s), qmin, qmax).astype(np.int8), np.asarray(s, np.float32))
    return out


__all__ = ["FAKE_QUANT", "INT8", "MIN_SCALE", "SCHEMA", "absmax_scale", "calibrate_activation_scales",
           "fake_quant", "qat_model", "quantize_weights"]
