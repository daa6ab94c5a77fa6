"""HIR ops: the model-level vocabulary (linear, attention, norms, activations, pooling, embedding).

Every HIR op carries three things a backend may use independently:

* ``infer`` checks shapes and dtypes, so a bad model fails at the line that built it;
* ``reference`` is a direct float64 NumPy implementation, written without the decomposition so
  that the two cross-check each other;
* ``decompose`` rebuilds the op from MIR primitives only, which is what a backend without a
  native kernel runs. Decompositions are written for low precision: softmaxes subtract the row
  max and norms compute the variance of centred values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import FLOAT_DTYPES, INDEX_DTYPES, INT_DTYPES, DType
from ..errors import DTypeError, IRError, ShapeError
from .builder import GraphBuilder, Tensor
from .indices import normalize as normalize_indices
from .schema import REGISTRY, AttrSpec, IndexInput, OpSchema, register_op
from .types import Attrs, Dim, TensorType, attr_float, attr_ints, broadcast_shapes, normalize_axis

FLOATS = FLOAT_DTYPES

_registered: list[str] = []


def _register(schema: OpSchema) -> None:
    register_op(schema)
    _registered.append(schema.name)


def _attrs(op: str, attrs: Mapping[str, Any]) -> Attrs:
    """Normalise attributes (fill defaults) so decompositions also accept a partial dict."""
    return REGISTRY.get(op).check_attrs(attrs, f"decomposition of {op}")


def _check_float(op: str, ts: Sequence[TensorType], names: Sequence[str]) -> DType:
    """All of ``ts`` must share one float dtype; returns it."""
    for t, n in zip(ts, names):
        if t.dtype not in FLOATS:
            raise DTypeError(f"{op}: {n} is {t.dtype}, a float dtype is required",
                             fix=f"{op} accepts {', '.join(map(str, FLOATS))}; cast first")
    d = ts[0].dtype
    for t, n in zip(ts[1:], names[1:]):
        if t.dtype != d:
            raise DTypeError(f"{op}: {n} is {t.dtype} but {names[0]} is {d}",
                             fix=f"cast {n} to {d} so all float operands match")
    return d


def _numel(t: TensorType) -> float:
    return float(t.numel())


def _static(d: Dim) -> int:
    """Symbolic dims count as 1 in cost estimates (the cost model rescales by bindings)."""
    return d if isinstance(d, int) else 1


# -- linear ------------------------------------------------------------------------------------

def linear_shape(op: str, x: TensorType, w: TensorType, b: TensorType) -> tuple[Dim, ...]:
    """The output shape of ``x @ w.T + b`` with ``w`` stored (out, in) like torch.nn.Linear; raises
    ShapeError naming ``op`` otherwise (shared by ``linear`` and the quantised ``matmul_i8``)."""
    if x.rank < 1:
        raise ShapeError(f"{op}: x must have rank >= 1", fix="reshape a scalar to [1]")
    if w.rank != 2:
        raise ShapeError(f"{op}: w must be (out, in), got shape {w.shape}",
                         fix="store weights as (out_features, in_features), like torch.nn.Linear")
    if w.shape[1] != x.shape[-1]:
        raise ShapeError(f"{op}: x has {x.shape[-1]} features but w {w.shape} expects {w.shape[1]}",
                         fix="w.shape[1] must equal x.shape[-1] (w is (out, in), not (in, out))")
    if b.shape != (w.shape[0],):
        raise ShapeError(f"{op}: bias shape {b.shape} must be ({w.shape[0]},)",
                         fix="pass one bias per output feature (zeros when the layer has none)")
    return (*x.shape[:-1], w.shape[0])


def _infer_linear(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, w, b = ts
    dt = _check_float("linear", ts, ("x", "w", "b"))
    return [TensorType(dt, linear_shape("linear", x, w, b))]


def _ref_linear(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w, b = xs
    return [np.matmul(x, w.T) + b]


def _dec_linear(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, w, b = ins
    return [g.op("matmul", x, g.op("transpose", w, perm=(1, 0))) + b]


def _flops_linear(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return (2.0 * _static(ins[0].shape[-1]) + 1.0) * _numel(outs[0])


_register(OpSchema(
    "linear", ("x", "w", "b"), _infer_linear, _ref_linear, level="hir", category="matmul",
    dtypes=FLOATS, flops=_flops_linear, decompose=_dec_linear, amp="low",
    doc="y = x @ w.T + b with w shaped (out, in) like torch.nn.Linear; pass a zero bias when the "
        "layer has none"))


# -- attention ---------------------------------------------------------------------------------

MASK_KINDS = ("none", "causal", "sliding_window", "bias", "padding")
_MASK_INPUTS = {"none": 3, "causal": 3, "sliding_window": 3, "bias": 4, "padding": 4}
#: The masked score used in float64 (and by f32/f64 decompositions).
MASKED_SCORE = -1e9


def masked_score(dtype: DType) -> float:
    """A large finite negative score for masked keys.

    Finite rather than -inf so a fully masked row softmaxes to uniform weights instead of NaN;
    half the dtype's minimum for f16/bf16 because -1e9 is not representable there and the
    max-subtraction must not overflow.
    """
    if dtype in (DType.F16, DType.BF16):
        if dtype is DType.BF16:
            import ml_dtypes

            return float(ml_dtypes.finfo(ml_dtypes.bfloat16).min) / 2
        return float(np.finfo(np.float16).min) / 2
    return MASKED_SCORE


def _infer_attention(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    kind = str(attrs["mask"])
    want = _MASK_INPUTS[kind]
    if len(ts) != want:
        extra = {"bias": "an additive bias broadcastable to the scores",
                 "padding": "a (batch, keys) keep-mask"}.get(kind)
        raise IRError(f"attention with mask={kind!r} takes {want} inputs (q, k, v"
                      f"{', mask' if want == 4 else ''}), got {len(ts)}",
                      fix=f"pass {extra} as the 4th input" if extra else
                      "drop the 4th input, or choose mask='bias' or mask='padding'")
    q, k, v = ts[:3]
    dt = _check_float("attention", ts[:3], ("q", "k", "v"))
    if q.rank not in (3, 4) or k.rank != q.rank or v.rank != q.rank:
        raise ShapeError(f"attention: q, k, v must all be (B, H, S, D) or all (B, S, D); got "
                         f"{q.shape}, {k.shape}, {v.shape}", fix="reshape to a common layout")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ShapeError(f"attention: batch/head dims differ: q {q.shape}, k {k.shape}, v {v.shape}",
                         fix="q, k and v need the same leading (B[, H]) dims; repeat k/v heads for GQA")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"attention: q head dim {q.shape[-1]} != k head dim {k.shape[-1]}",
                         fix="q and k must have the same last dim")
    if k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"attention: k has {k.shape[-2]} keys but v has {v.shape[-2]}",
                         fix="k and v must have the same sequence length")
    if attrs["scale"] is None and isinstance(q.shape[-1], str):
        raise ShapeError(f"attention: head dim {q.shape[-1]!r} is symbolic, so 1/sqrt(D) is unknown",
                         fix="pass scale=... explicitly")
    window = attrs["window"]
    if kind == "sliding_window":
        if window is None or window < 1:  # type: ignore[operator]
            raise IRError(f"attention: mask='sliding_window' needs window >= 1, got {window}",
                          fix="pass window=W (each query sees itself and the W-1 keys before it)")
    elif window is not None:
        raise IRError(f"attention: window={window} is only used with mask='sliding_window' "
                      f"(mask is {kind!r})", fix="set mask='sliding_window' or drop window")
    scores = (*q.shape[:-1], k.shape[-2])
    if kind == "bias":
        m = ts[3]
        if m.dtype != dt:
            raise DTypeError(f"attention: bias is {m.dtype} but q is {dt}", fix=f"cast the bias to {dt}")
        try:
            ok = broadcast_shapes(m.shape, scores) == scores
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"attention: bias {m.shape} does not broadcast to the scores {scores}",
                             fix="the bias must broadcast to (B, H, Sq, Sk) (or (B, Sq, Sk))")
    elif kind == "padding":
        m = ts[3]
        if not (m.dtype is DType.BOOL or m.dtype in FLOATS or m.dtype in INT_DTYPES):
            raise DTypeError(f"attention: padding mask is {m.dtype}",
                             fix="pass a bool, int or float mask (nonzero = keep)")
        if m.shape != (q.shape[0], k.shape[-2]):
            raise ShapeError(f"attention: padding mask {m.shape} must be (batch, keys) = "
                             f"({q.shape[0]}, {k.shape[-2]})",
                             fix="pass the (B, Sk) attention_mask (1/True = keep, 0/False = masked)")
    return [TensorType(dt, (*q.shape[:-1], v.shape[-1]))]


def _attention_scale(attrs: Attrs, d: Dim) -> float:
    s = attrs["scale"]
    return float(s) if s is not None else 1.0 / math.sqrt(d)  # type: ignore[arg-type]


def _ref_attention(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    q, k, v = xs[:3]
    kind = attrs["mask"]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * _attention_scale(attrs, q.shape[-1])
    sq, sk = s.shape[-2:]
    if kind in ("causal", "sliding_window"):
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        keep = j <= i
        if kind == "sliding_window":
            keep &= j > i - int(attrs["window"])  # type: ignore[arg-type]
        s = np.where(keep, s, MASKED_SCORE)
    elif kind == "bias":
        s = s + xs[3]
    elif kind == "padding":
        keep = (xs[3] != 0).reshape((q.shape[0],) + (1,) * (q.ndim - 2) + (sk,))
        s = np.where(keep, s, MASKED_SCORE)
    with np.errstate(all="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return [np.matmul(e / e.sum(axis=-1, keepdims=True), v)]


def _softmax_last(g: GraphBuilder, s: Tensor) -> Tensor:
    ax = (s.rank - 1,)
    e = g.op("exp", s - g.op("reduce_max", s, axes=ax, keepdims=True))
    return e / g.op("reduce_sum", e, axes=ax, keepdims=True)


def _dec_attention(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("attention", attrs)
    q, k, v = ins[:3]
    kind = a["mask"]
    dt = q.dtype
    r = q.rank
    # Scaling q (not the scores) keeps f16 logits of large-D heads from overflowing.
    qs = q * g.const(_attention_scale(a, q.shape[-1]), dt)
    kt = g.op("transpose", k, perm=(*range(r - 2), r - 1, r - 2))
    s = g.op("matmul", qs, kt)
    sq, sk = s.shape[-2], s.shape[-1]
    if kind in ("causal", "sliding_window"):
        i = g.op("iota", shape=(sq, sk), axis=0, dtype=DType.I64)
        j = g.op("iota", shape=(sq, sk), axis=1, dtype=DType.I64)
        keep = g.op("less_equal", j, i)
        if kind == "sliding_window":
            lo = i - g.const(int(a["window"]), DType.I64)  # type: ignore[arg-type]
            keep = g.op("logical_and", keep, g.op("greater", j, lo))
        s = g.op("where", keep, s, g.const(masked_score(dt), dt))
    elif kind == "bias":
        s = s + ins[3]
    elif kind == "padding":
        m = ins[3]
        keep = m if m.dtype is DType.BOOL else g.op("not_equal", m, g.const(0, m.dtype))
        keep = g.op("reshape", keep, shape=(m.shape[0],) + (1,) * (r - 2) + (m.shape[1],))
        s = g.op("where", keep, s, g.const(masked_score(dt), dt))
    return [g.op("matmul", _softmax_last(g, s), v)]


def _flops_attention(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    q, k, v = ins[:3]
    scores = _numel(q) / _static(q.shape[-1]) * _static(k.shape[-2])
    # QK^T and PV matmuls, plus ~5 ops per score for scale, mask and softmax.
    return scores * (2.0 * _static(q.shape[-1]) + 2.0 * _static(v.shape[-1]) + 5.0)


_register(OpSchema(
    "attention", ("q", "k", "v", "mask*"), _infer_attention, _ref_attention, level="hir",
    category="attention", dtypes=FLOATS, flops=_flops_attention, decompose=_dec_attention, amp="low",
    attrs=(AttrSpec("mask", "str", default="none", choices=MASK_KINDS,
                    doc="none | causal | sliding_window | bias (4th input added to the scores) | "
                        "padding (4th input (B, Sk), nonzero = keep)"),
           AttrSpec("window", "int", default=None,
                    doc="sliding_window only: key j is visible to query i iff i - window < j <= i"),
           AttrSpec("scale", "float", default=None, doc="score scale; None means 1/sqrt(head dim)")),
    doc="softmax(q @ k^T * scale + mask) @ v for q (B, H, Sq, D) and k, v (B, H, Sk, D), or the "
        "same without H. Causal masks align top-left (key j visible to query i iff j <= i, as "
        "torch's is_causal). Masked scores are a large finite negative (-1e9; half the dtype "
        "minimum for f16/bf16), so a fully masked row attends uniformly instead of giving NaN."))


# -- normalisation -----------------------------------------------------------------------------

def _norm_axes(op: str, x: TensorType, axis: Any) -> tuple[int, ...]:
    ax = normalize_axis(int(axis), x.rank)
    return tuple(range(ax, x.rank))


def _check_affine(op: str, x: TensorType, axes: tuple[int, ...], params: Sequence[TensorType],
                  names: Sequence[str]) -> None:
    want = tuple(x.shape[a] for a in axes)
    for p, n in zip(params, names):
        if p.shape != want:
            raise ShapeError(f"{op}: {n} has shape {p.shape}, expected {want} (the normalised "
                             f"trailing dims of x {x.shape})",
                             fix=f"{n} must have the shape of x's dims from axis on")


def _infer_layer_norm(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_float("layer_norm", ts, ("x", "gamma", "beta"))
    if ts[0].rank < 1:
        raise ShapeError("layer_norm: x must have rank >= 1", fix="reshape a scalar to [1]")
    axes = _norm_axes("layer_norm", ts[0], attrs["axis"])
    _check_affine("layer_norm", ts[0], axes, ts[1:], ("gamma", "beta"))
    return [ts[0]]


def _ref_layer_norm(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, gamma, beta = xs
    axes = tuple(range(normalize_axis(int(attrs["axis"]), x.ndim), x.ndim))  # type: ignore[arg-type]
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return [(x - mean) / np.sqrt(var + float(attrs["eps"])) * gamma + beta]  # type: ignore[arg-type]


_HALF = (DType.F16, DType.BF16)


def rstd(g: GraphBuilder, var: Tensor, eps: float) -> Tensor:
    """``1/sqrt(var + eps)``: the inverse standard deviation of every norm, in its decomposition and
    in its derivative rules (:mod:`rlx_core.autodiff.hir_rules`), built one way."""
    return g.op("rsqrt", var + g.const(eps, var.dtype))


def _up(g: GraphBuilder, *xs: Tensor) -> list[Tensor]:
    """Half-precision operands in f32: squares and window sums overflow or lose bits in f16."""
    return [g.op("cast", x, to=DType.F32) if x.dtype in _HALF else x for x in xs]


def _down(g: GraphBuilder, y: Tensor, like: Tensor) -> Tensor:
    return g.op("cast", y, to=like.dtype) if like.dtype != y.dtype else y


def _dec_layer_norm(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("layer_norm", attrs)
    x0 = ins[0]
    x, gamma, beta = _up(g, *ins)
    axes = _norm_axes("layer_norm", x.type, a["axis"])
    # Variance of centred values: E[x^2] - E[x]^2 cancels catastrophically in f16/f32.
    c = x - g.op("reduce_mean", x, axes=axes, keepdims=True)
    var = g.op("reduce_mean", c * c, axes=axes, keepdims=True)
    return [_down(g, c * rstd(g, var, attr_float(a, "eps")) * gamma + beta, x0)]


_NORM_ATTRS = (AttrSpec("axis", "int", default=-1, doc="normalise axes axis..rank-1"),)

_register(OpSchema(
    "layer_norm", ("x", "gamma", "beta"), _infer_layer_norm, _ref_layer_norm, level="hir",
    category="normalization", dtypes=FLOATS, decompose=_dec_layer_norm, amp="f32",
    flops=lambda i, o, a: 8.0 * _numel(o[0]),
    attrs=(*_NORM_ATTRS, AttrSpec("eps", "float", default=1e-05)),
    doc="(x - mean) / sqrt(var + eps) * gamma + beta over the trailing axes from `axis`; gamma "
        "and beta have those trailing dims"))


def _infer_rms_norm(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_float("rms_norm", ts, ("x", "gamma"))
    if ts[0].rank < 1:
        raise ShapeError("rms_norm: x must have rank >= 1", fix="reshape a scalar to [1]")
    axes = _norm_axes("rms_norm", ts[0], attrs["axis"])
    _check_affine("rms_norm", ts[0], axes, ts[1:], ("gamma",))
    return [ts[0]]


def _ref_rms_norm(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, gamma = xs
    axes = tuple(range(normalize_axis(int(attrs["axis"]), x.ndim), x.ndim))  # type: ignore[arg-type]
    ms = (x * x).mean(axis=axes, keepdims=True)
    return [x / np.sqrt(ms + float(attrs["eps"])) * gamma]  # type: ignore[arg-type]


def _dec_rms_norm(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("rms_norm", attrs)
    x0 = ins[0]
    x, gamma = _up(g, *ins)
    axes = _norm_axes("rms_norm", x.type, a["axis"])
    ms = g.op("reduce_mean", x * x, axes=axes, keepdims=True)
    return [_down(g, x * rstd(g, ms, attr_float(a, "eps")) * gamma, x0)]


_register(OpSchema(
    "rms_norm", ("x", "gamma"), _infer_rms_norm, _ref_rms_norm, level="hir",
    category="normalization", dtypes=FLOATS, decompose=_dec_rms_norm, amp="f32",
    flops=lambda i, o, a: 5.0 * _numel(o[0]),
    attrs=(*_NORM_ATTRS, AttrSpec("eps", "float", default=1e-06)),
    doc="x / sqrt(mean(x^2) + eps) * gamma over the trailing axes from `axis`"))


def _infer_batch_norm(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    names = ("x", "scale", "bias", "mean", "var")
    _check_float("batch_norm", ts, names)
    x = ts[0]
    if x.rank < 2:
        raise ShapeError(f"batch_norm: x must be (N, C, ...) with rank >= 2, got {x.shape}",
                         fix="add a batch axis")
    for t, n in zip(ts[1:], names[1:]):
        if t.shape != (x.shape[1],):
            raise ShapeError(f"batch_norm: {n} has shape {t.shape}, expected ({x.shape[1]},)",
                             fix="pass one value per channel (axis 1 of x)")
    return [x]


def _ref_batch_norm(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, scale, bias, mean, var = xs
    view = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + float(attrs["eps"]))  # type: ignore[arg-type]
    return [(x - mean.reshape(view)) * inv.reshape(view) + bias.reshape(view)]


def _dec_batch_norm(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("batch_norm", attrs)
    x, scale, bias, mean, var = ins
    view = (x.shape[1],) + (1,) * (x.rank - 2)
    inv = scale * rstd(g, var, attr_float(a, "eps"))

    def per_channel(t: Tensor) -> Tensor:
        return g.op("reshape", t, shape=view)

    return [(x - per_channel(mean)) * per_channel(inv) + per_channel(bias)]


_register(OpSchema(
    "batch_norm", ("x", "scale", "bias", "mean", "var"), _infer_batch_norm, _ref_batch_norm,
    level="hir", category="normalization", dtypes=FLOATS, decompose=_dec_batch_norm, amp="f32",
    flops=lambda i, o, a: 2.0 * _numel(o[0]),
    attrs=(AttrSpec("eps", "float", default=1e-5),),
    doc="inference batch norm over channel axis 1 (NCHW, any rank >= 2): "
        "(x - mean) / sqrt(var + eps) * scale + bias"))


# -- activations -------------------------------------------------------------------------------

def _infer_float_unary(op: str) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        _check_float(op, ts, ("x",))
        return [ts[0]]
    return infer


_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _ref_gelu(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    if attrs["approximate"] == "tanh":
        return [0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))]
    return [0.5 * x * (1.0 + (_erf(x / math.sqrt(2.0)) if x.size else x))]


def _dec_gelu(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("gelu", attrs)
    x = ins[0]
    dt = x.dtype
    if a["approximate"] == "tanh":
        inner = g.const(_SQRT_2_OVER_PI, dt) * (x + g.const(0.044715, dt) * (x * x * x))
        t = g.op("tanh", inner)
    else:
        t = g.op("erf", x * g.const(1.0 / math.sqrt(2.0), dt))
    return [g.const(0.5, dt) * x * (g.const(1.0, dt) + t)]


_register(OpSchema(
    "gelu", ("x",), _infer_float_unary("gelu"), _ref_gelu, level="hir", category="activation",
    dtypes=FLOATS, elementwise=True, decompose=_dec_gelu,
    attrs=(AttrSpec("approximate", "str", default="none", choices=("none", "tanh"),
                    doc="'none': exact 0.5x(1+erf(x/sqrt2)); 'tanh': the GPT-2 approximation"),),
    doc="Gaussian error linear unit (torch.nn.functional.gelu)"))


def _ref_silu(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    # sigmoid(x) = (1 + tanh(x/2)) / 2 never overflows, unlike 1/(1+exp(-x)) for very negative x.
    x = xs[0]
    return [x * 0.5 * (1.0 + np.tanh(0.5 * x))]


def _dec_silu(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [ins[0] * g.op("sigmoid", ins[0])]


_register(OpSchema(
    "silu", ("x",), _infer_float_unary("silu"), _ref_silu, level="hir", category="activation",
    dtypes=FLOATS, elementwise=True, decompose=_dec_silu, doc="x * sigmoid(x) (swish)"))


def _dec_relu(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [g.op("maximum", ins[0], g.const(0, ins[0].dtype))]


_register(OpSchema(
    "relu", ("x",), _infer_float_unary("relu"), lambda xs, a: [np.maximum(xs[0], 0.0)], level="hir",
    category="activation", dtypes=FLOATS, elementwise=True, decompose=_dec_relu,
    doc="max(x, 0); NaN propagates"))


def _infer_softmax(op: str) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        _check_float(op, ts, ("x",))
        if ts[0].rank < 1:
            raise ShapeError(f"{op} of a scalar", fix="reshape to [1] (the result would be 1 or 0)")
        ax = normalize_axis(int(attrs["axis"]), ts[0].rank)  # type: ignore[arg-type]
        if ts[0].shape[ax] == 0:
            raise ShapeError(f"{op} over an empty axis", fix="the softmax axis must be non-empty")
        return [ts[0]]
    return infer


def _ref_softmax(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    e = np.exp(x - x.max(axis=ax, keepdims=True))
    return [e / e.sum(axis=ax, keepdims=True)]


def _ref_log_softmax(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    ax = normalize_axis(int(attrs["axis"]), x.ndim)  # type: ignore[arg-type]
    s = x - x.max(axis=ax, keepdims=True)
    return [s - np.log(np.exp(s).sum(axis=ax, keepdims=True))]


def _dec_softmax(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("softmax", attrs)
    x = ins[0]
    ax = (normalize_axis(int(a["axis"]), x.rank),)  # type: ignore[arg-type]
    e = g.op("exp", x - g.op("reduce_max", x, axes=ax, keepdims=True))
    return [e / g.op("reduce_sum", e, axes=ax, keepdims=True)]


def _dec_log_softmax(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("log_softmax", attrs)
    x = ins[0]
    ax = (normalize_axis(int(a["axis"]), x.rank),)  # type: ignore[arg-type]
    s = x - g.op("reduce_max", x, axes=ax, keepdims=True)
    return [s - g.op("log", g.op("reduce_sum", g.op("exp", s), axes=ax, keepdims=True))]


_AXIS = (AttrSpec("axis", "int", default=-1),)

_register(OpSchema(
    "softmax", ("x",), _infer_softmax("softmax"), _ref_softmax, level="hir", category="activation",
    dtypes=FLOATS, decompose=_dec_softmax, attrs=_AXIS, flops=lambda i, o, a: 5.0 * _numel(o[0]), amp="f32",
    doc="exp(x - max) / sum(exp(x - max)) along axis"))

_register(OpSchema(
    "log_softmax", ("x",), _infer_softmax("log_softmax"), _ref_log_softmax, level="hir",
    category="activation", dtypes=FLOATS, decompose=_dec_log_softmax, attrs=_AXIS, amp="f32",
    flops=lambda i, o, a: 5.0 * _numel(o[0]),
    doc="(x - max) - log(sum(exp(x - max))) along axis"))


# -- convolution and pooling -------------------------------------------------------------------

_CONV_ATTRS = (AttrSpec("strides", "ints", default=(1, 1)),
               AttrSpec("pads", "ints", default=(0, 0, 0, 0), doc="(top, left, bottom, right)"),
               AttrSpec("dilations", "ints", default=(1, 1)),
               AttrSpec("groups", "int", default=1))


def _infer_conv2d_bias(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = _check_float("conv2d_bias", ts, ("x", "w", "b"))
    (out,) = REGISTRY.get("conv2d").infer(ts[:2], attrs)
    if ts[2].shape != (ts[1].shape[0],):
        raise ShapeError(f"conv2d_bias: bias shape {ts[2].shape} must be ({ts[1].shape[0]},)",
                         fix="pass one bias per output channel (w.shape[0])")
    return [TensorType(dt, out.shape)]


def _ref_conv2d_bias(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w, b = xs
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = (attr_ints(attrs, "strides"), attr_ints(attrs, "pads"),
                                             attr_ints(attrs, "dilations"))
    g = int(attrs["groups"])  # type: ignore[arg-type]
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    # All dilated windows at stride 1, then subsample: (N, C, Ho, Wo, kh, kw).
    win = np.lib.stride_tricks.sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1),
                                                   axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    n, _, ho, wo = win.shape[:4]
    win = win.reshape(n, g, cg, ho, wo, kh, kw)
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg).reshape(n, o, ho, wo)
    return [y + b.reshape(1, o, 1, 1)]


def _dec_conv2d_bias(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("conv2d_bias", attrs)
    x, w, b = ins
    y = g.op("conv2d", x, w, name=None, **dict(a))  # name: the node's, not an attribute
    return [y + g.op("reshape", b, shape=(w.shape[0], 1, 1))]


def _flops_conv2d_bias(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    _, ci, kh, kw = ins[1].shape
    return (2.0 * _static(ci) * _static(kh) * _static(kw) + 1.0) * _numel(outs[0])


_register(OpSchema(
    "conv2d_bias", ("x", "w", "b"), _infer_conv2d_bias, _ref_conv2d_bias, level="hir",
    category="conv", dtypes=FLOATS, flops=_flops_conv2d_bias, decompose=_dec_conv2d_bias, amp="low",
    attrs=_CONV_ATTRS,
    doc="2-D cross-correlation (x NCHW, w OIHW, as MIR conv2d) plus a per-output-channel bias b (O,)"))


def _pool_params(op: str, attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    k = attr_ints(attrs, "kernel")
    s = attr_ints(attrs, "strides") if attrs["strides"] is not None else k
    p = attr_ints(attrs, "pads")
    if len(k) != 2 or min(k) < 1:
        raise ShapeError(f"{op}: kernel {k} must be two sizes >= 1", fix="kernel=(kh, kw)")
    if len(s) != 2 or min(s) < 1:
        raise ShapeError(f"{op}: strides {s} must be two values >= 1", fix="strides=(sh, sw)")
    if len(p) != 4 or min(p) < 0:
        raise ShapeError(f"{op}: pads {p} must be four values >= 0", fix="pads=(top, left, bottom, right)")
    kh, kw = k
    if max(p[0], p[2]) >= kh or max(p[1], p[3]) >= kw:
        # Otherwise a window could hold only padding: -inf for max, 0/0 for an exclusive average.
        raise ShapeError(f"{op}: pads {p} must be smaller than the kernel {k} on each side",
                         fix="reduce the padding (torch allows at most half the kernel)")
    return (kh, kw), (s[0], s[1]), (p[0], p[1], p[2], p[3])


def _pool_out(op: str, x: TensorType, attrs: Attrs) -> tuple[int, int]:
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = _pool_params(op, attrs)
    h, w = x.shape[2], x.shape[3]
    if isinstance(h, str) or isinstance(w, str):
        raise ShapeError(f"{op}: spatial dims ({h}, {w}) must be static", fix="specialize the graph first")
    ho = (h + pt + pb - kh) // sh + 1
    wo = (w + pl + pr - kw) // sw + 1
    if ho < 1 or wo < 1:
        raise ShapeError(f"{op}: output would be {ho}x{wo}",
                         fix="the kernel is larger than the padded input; shrink it or pad more")
    return ho, wo


def _infer_pool(op: str) -> Any:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        _check_float(op, ts, ("x",))
        x = ts[0]
        if x.rank != 4:
            raise ShapeError(f"{op}: x must be NCHW (rank 4), got {x.shape}", fix="reshape to 4-D")
        ho, wo = _pool_out(op, x, attrs)
        return [TensorType(x.dtype, (*x.shape[:2], ho, wo))]
    return infer


def _windows(x: np.ndarray, op: str, attrs: Attrs, fill: float) -> np.ndarray:
    """(N, C, Ho, Wo, kh, kw) windows of x padded with ``fill``."""
    k, (sh, sw), (pt, pl, pb, pr) = _pool_params(op, attrs)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(xp, k, axis=(2, 3))[:, :, ::sh, ::sw]


def _ref_max_pool(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [_windows(xs[0], "max_pool2d", attrs, -np.inf).max(axis=(-2, -1))]


def _ref_avg_pool(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    total = _windows(x, "avg_pool2d", attrs, 0.0).sum(axis=(-2, -1))
    if attrs["count_include_pad"]:
        kh, kw = attr_ints(attrs, "kernel")
        return [total / (kh * kw)]
    count = _windows(np.ones((1, 1, *x.shape[2:])), "avg_pool2d", attrs, 0.0).sum(axis=(-2, -1))
    return [total / count]


def _taps(g: GraphBuilder, x: Tensor, op: str, attrs: Attrs, fill: float) -> list[Tensor]:
    """One strided slice of the padded input per kernel tap; combining them gives the pool."""
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = _pool_params(op, attrs)
    ho, wo = _pool_out(op, x.type, attrs)
    if any((pt, pl, pb, pr)):
        x = g.op("pad", x, pads=(0, 0, pt, pl, 0, 0, pb, pr), value=fill)
    return [g.op("slice", x, starts=(i, j), stops=(i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1),
                 axes=(2, 3), steps=(sh, sw))
            for i in range(kh) for j in range(kw)]


def _dec_max_pool(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("max_pool2d", attrs)
    taps = _taps(g, ins[0], "max_pool2d", a, float("-inf"))
    y = taps[0]
    for t in taps[1:]:
        y = g.op("maximum", y, t)
    return [y]


def _dec_avg_pool(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    a = _attrs("avg_pool2d", attrs)
    x0 = ins[0]
    (x,) = _up(g, x0)  # the window sum accumulates in at least f32
    taps = _taps(g, x, "avg_pool2d", a, 0.0)
    y = taps[0]
    for t in taps[1:]:
        y = y + t
    kh, kw = attr_ints(a, "kernel")
    if a["count_include_pad"] or not any(attr_ints(a, "pads")):
        return [_down(g, y / g.const(kh * kw, x.dtype), x0)]
    # Shapes are static, so the per-window count of real elements is a build-time constant.
    h, w = x.shape[2], x.shape[3]
    assert isinstance(h, int) and isinstance(w, int)  # _taps -> _pool_out has checked they are static
    count = _windows(np.ones((1, 1, h, w)), "avg_pool2d", a, 0.0).sum(axis=(-2, -1))
    return [_down(g, y / g.const(count, x.dtype), x0)]


def _flops_pool(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    kh, kw = attr_ints(attrs, "kernel")
    return float(kh * kw) * _numel(outs[0])


_POOL_ATTRS = (AttrSpec("kernel", "ints", doc="(kh, kw)"),
               AttrSpec("strides", "ints", default=None, doc="(sh, sw); None means the kernel size"),
               AttrSpec("pads", "ints", default=(0, 0, 0, 0),
                        doc="(top, left, bottom, right), each smaller than the kernel"))

_register(OpSchema(
    "max_pool2d", ("x",), _infer_pool("max_pool2d"), _ref_max_pool, level="hir", category="pool",
    dtypes=FLOATS, flops=_flops_pool, decompose=_dec_max_pool, attrs=_POOL_ATTRS,
    doc="2-D max pooling over NCHW; padding never wins the max"))

_register(OpSchema(
    "avg_pool2d", ("x",), _infer_pool("avg_pool2d"), _ref_avg_pool, level="hir", category="pool",
    dtypes=FLOATS, flops=_flops_pool, decompose=_dec_avg_pool,
    attrs=(*_POOL_ATTRS,
           AttrSpec("count_include_pad", "bool", default=True,
                    doc="divide by kh*kw (True) or by the number of unpadded elements")),
    doc="2-D average pooling over NCHW"))


# -- embedding ---------------------------------------------------------------------------------

def _infer_embedding(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    table, ids = ts
    _check_float("embedding", ts[:1], ("table",))
    if ids.dtype not in INDEX_DTYPES:
        raise DTypeError(f"embedding: ids are {ids.dtype}",
                         fix=f"ids must be {' or '.join(map(str, INDEX_DTYPES))}; cast them")
    if table.rank != 2:
        raise ShapeError(f"embedding: table must be (vocab, dim), got {table.shape}",
                         fix="reshape the table to 2-D")
    return [TensorType(table.dtype, (*ids.shape, table.shape[1]))]


def _ref_embedding(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    table, ids = xs
    return [table[normalize_indices(ids, table.shape[0], what="embedding ids")]]


def _dec_embedding(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [g.op("gather", ins[0], ins[1], axis=0)]


_register(OpSchema(
    "embedding", ("table", "ids"), _infer_embedding, _ref_embedding, level="hir",
    category="embedding", dtypes=FLOATS + INDEX_DTYPES, flops=lambda i, o, a: 0.0,
    decompose=_dec_embedding, index_inputs=(IndexInput(1, axis_attr=None, axis=0),),
    doc="table[ids]: a (vocab, dim) float table looked up by integer ids of any shape -> "
        "ids.shape + (dim,). Ids follow ONNX Gather: valid in [-vocab, vocab-1], a negative id "
        "counts from the end once, anything else is an error (InputError; see rlx_core.ir.indices)"))


#: Names of the core HIR ops, in registration order.
HIR_OPS: tuple[str, ...] = tuple(_registered)
