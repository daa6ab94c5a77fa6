"""Explicit rules for the HIR ops where they beat differentiating the decomposition.

softmax, log_softmax, layer_norm, rms_norm, linear, attention (reverse), conv2d_bias, embedding and
the activations have rules here. ``batch_norm``, ``max_pool2d``, ``avg_pool2d`` and attention's
forward mode are differentiated through their MIR decomposition (exact, see ``transforms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..dtypes import DType
from ..ir.builder import GraphBuilder, Tensor
from ..ir.hir import masked_score, rstd
from ..ir.types import Attrs, normalize_axis
from ._util import count, reshape, sum_to, swap_last
from .registry import register_jvp, register_vjp
from .rules import conv_input_grad, conv_weight_grad, gather_transpose

Cts = Sequence["Tensor | None"]
Ts = Sequence[Tensor]
B = GraphBuilder


def _c(b: GraphBuilder, value: float, like: Tensor) -> Tensor:
    return b.const(value, like.dtype)


def _sum_keep(b: GraphBuilder, t: Tensor, axes: Sequence[int]) -> Tensor:
    return b.op("reduce_sum", t, axes=tuple(axes), keepdims=True)


def _mean_keep(b: GraphBuilder, t: Tensor, axes: Sequence[int]) -> Tensor:
    if all(isinstance(t.shape[a], int) for a in axes):
        return b.op("reduce_mean", t, axes=tuple(axes), keepdims=True)
    return _sum_keep(b, t, axes) / count(b, t.shape, axes, t.dtype)


def _sum_lead(b: GraphBuilder, t: Tensor, n_lead: int) -> Tensor:
    return b.op("reduce_sum", t, axes=tuple(range(n_lead)), keepdims=False) if n_lead else t


def _add_all(parts: list[Tensor]) -> Tensor | None:
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


# -- activations (elementwise: vjp and jvp share "v * f'(x)") ------------------------------------

def _activation(op: str, apply: Any) -> None:
    def vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
        return [None if cts[0] is None else apply(b, cts[0], ins[0], outs[0], attrs)]

    def jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
        return [None if ts[0] is None else apply(b, ts[0], ins[0], outs[0], attrs)]

    register_vjp(op, vjp)
    register_jvp(op, jvp)


def _relu(b: GraphBuilder, v: Tensor, x: Tensor, y: Tensor, attrs: Attrs) -> Tensor:
    # Masked by the output (y > 0 exactly when x > 0, NaN included): the pre-activation is then
    # dead after the forward relu, which may overwrite it in place.
    return b.op("where", b.op("greater", y, _c(b, 0.0, y)), v, _c(b, 0.0, v))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(b: GraphBuilder, v: Tensor, x: Tensor, y: Tensor, attrs: Attrs) -> Tensor:
    one, half = _c(b, 1.0, x), _c(b, 0.5, x)
    if attrs["approximate"] == "tanh":
        k = 0.044715
        x2 = x * x
        t = b.op("tanh", _c(b, _SQRT_2_OVER_PI, x) * (x + _c(b, k, x) * (x2 * x)))
        du = _c(b, _SQRT_2_OVER_PI, x) * (one + _c(b, 3 * k, x) * x2)
        d = half * (one + t) + half * x * (one - t * t) * du
    else:
        cdf = half * (one + b.op("erf", x * _c(b, 1.0 / math.sqrt(2.0), x)))
        pdf = b.op("exp", x * x * _c(b, -0.5, x)) * _c(b, 1.0 / math.sqrt(2.0 * math.pi), x)
        d = cdf + x * pdf
    return v * d


def _silu(b: GraphBuilder, v: Tensor, x: Tensor, y: Tensor, attrs: Attrs) -> Tensor:
    s = b.op("sigmoid", x)
    one = _c(b, 1.0, x)
    return v * (s * (one + x * (one - s)))


_activation("relu", _relu)
_activation("gelu", _gelu)
_activation("silu", _silu)


# -- softmax / log_softmax -----------------------------------------------------------------------

def _ax(attrs: Attrs, t: Tensor) -> tuple[int]:
    return (normalize_axis(int(attrs["axis"]), t.rank),)  # type: ignore[arg-type]


@register_vjp("softmax")
def _softmax_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g, y = cts[0], outs[0]
    if g is None:
        return [None]
    return [y * (g - _sum_keep(b, g * y, _ax(attrs, y)))]


@register_jvp("softmax")
def _softmax_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    t, y = ts[0], outs[0]
    if t is None:
        return [None]
    return [y * (t - _sum_keep(b, t * y, _ax(attrs, y)))]


@register_vjp("log_softmax")
def _log_softmax_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                     attrs: Attrs) -> list:
    g, y = cts[0], outs[0]
    if g is None:
        return [None]
    return [g - b.op("exp", y) * _sum_keep(b, g, _ax(attrs, y))]


@register_jvp("log_softmax")
def _log_softmax_jvp(b: B, ins: Ts, outs: Ts, ts: Cts,
                     attrs: Attrs) -> list:
    t, y = ts[0], outs[0]
    if t is None:
        return [None]
    return [t - _sum_keep(b, b.op("exp", y) * t, _ax(attrs, y))]


# -- layer_norm / rms_norm -----------------------------------------------------------------------

def _norm_axes(attrs: Attrs, x: Tensor) -> tuple[int, ...]:
    return tuple(range(normalize_axis(int(attrs["axis"]), x.rank), x.rank))  # type: ignore[arg-type]


def _ln_stats(b: GraphBuilder, x: Tensor, axes: Sequence[int], eps: float) -> tuple[Tensor, Tensor]:
    c = x - _mean_keep(b, x, axes)
    inv = rstd(b, _mean_keep(b, c * c, axes), eps)
    return c * inv, inv


@register_vjp("layer_norm")
def _layer_norm_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                    attrs: Attrs) -> list:
    g = cts[0]
    x, gamma, _ = ins
    if g is None:
        return [None, None, None]
    axes = _norm_axes(attrs, x)
    xhat, rstd = _ln_stats(b, x, axes, float(attrs["eps"]))  # type: ignore[arg-type]
    dxh = g * gamma
    dx = rstd * (dxh - _mean_keep(b, dxh, axes) - xhat * _mean_keep(b, dxh * xhat, axes))
    return [dx, _sum_lead(b, g * xhat, axes[0]), _sum_lead(b, g, axes[0])]


@register_jvp("layer_norm")
def _layer_norm_jvp(b: B, ins: Ts, outs: Ts, ts: Cts,
                    attrs: Attrs) -> list:
    tx, tg, tb = ts
    x, gamma, _ = ins
    axes = _norm_axes(attrs, x)
    xhat, rstd = _ln_stats(b, x, axes, float(attrs["eps"]))  # type: ignore[arg-type]
    parts = []
    if tx is not None:
        dxhat = rstd * (tx - _mean_keep(b, tx, axes) - xhat * _mean_keep(b, tx * xhat, axes))
        parts.append(dxhat * gamma)
    if tg is not None:
        parts.append(xhat * tg)
    if tb is not None:
        parts.append(tb)
    out = _add_all(parts)
    return [out if out is None or out.shape == x.shape else b.op("expand", out, shape=x.shape)]


def _rms(b: GraphBuilder, x: Tensor, axes: Sequence[int], eps: float) -> Tensor:
    return rstd(b, _mean_keep(b, x * x, axes), eps)


@register_vjp("rms_norm")
def _rms_norm_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                  attrs: Attrs) -> list:
    g = cts[0]
    x, gamma = ins
    if g is None:
        return [None, None]
    axes = _norm_axes(attrs, x)
    r = _rms(b, x, axes, float(attrs["eps"]))  # type: ignore[arg-type]
    dxh = g * gamma
    dx = r * dxh - x * (r * r * r) * _mean_keep(b, dxh * x, axes)
    return [dx, _sum_lead(b, g * x * r, axes[0])]


@register_jvp("rms_norm")
def _rms_norm_jvp(b: B, ins: Ts, outs: Ts, ts: Cts,
                  attrs: Attrs) -> list:
    tx, tg = ts
    x, gamma = ins
    axes = _norm_axes(attrs, x)
    r = _rms(b, x, axes, float(attrs["eps"]))  # type: ignore[arg-type]
    parts = []
    if tx is not None:
        parts.append((r * tx - x * (r * r * r) * _mean_keep(b, x * tx, axes)) * gamma)
    if tg is not None:
        parts.append(x * r * tg)
    return [_add_all(parts)]


# -- linear --------------------------------------------------------------------------------------

def _static(t: Tensor) -> bool:
    return all(isinstance(d, int) for d in t.shape)


@register_vjp("linear")
def _linear_vjp(b: B, ins: Ts, outs: Ts, cts: Cts, attrs: Attrs) -> list:
    g = cts[0]
    x, w, _ = ins
    if g is None:
        return [None, None, None]
    n_out, n_in = w.shape
    dx = b.op("matmul", g, w)
    r = x.rank
    if r == 1:
        dw = b.op("matmul", reshape(b, g, (n_out, 1)), reshape(b, x, (1, n_in)))
    elif r == 2 or (_static(x) and _static(g)):
        xf = reshape(b, x, (-1, n_in)) if r > 2 else x
        gf = reshape(b, g, (-1, n_out)) if r > 2 else g
        dw = b.op("matmul", b.op("transpose", gf, perm=(1, 0)), xf)
    else:
        dw = _sum_lead(b, b.op("matmul", swap_last(b, g), x), r - 2)
    return [dx, dw, _sum_lead(b, g, r - 1)]


@register_jvp("linear")
def _linear_jvp(b: B, ins: Ts, outs: Ts, ts: Cts, attrs: Attrs) -> list:
    tx, tw, tb = ts
    x, w, _ = ins
    parts = []
    if tx is not None:
        parts.append(b.op("matmul", tx, b.op("transpose", w, perm=(1, 0))))
    if tw is not None:
        parts.append(b.op("matmul", x, b.op("transpose", tw, perm=(1, 0))))
    if tb is not None:
        parts.append(tb if parts else b.op("expand", tb, shape=outs[0].shape))
    return [_add_all(parts)]


# -- attention (reverse mode; forward mode goes through the decomposition) ------------------------

def _attention_scores(b: GraphBuilder, ins: Sequence[Tensor], attrs: Attrs
                      ) -> tuple[Tensor, Tensor | None, Tensor, float]:
    """(masked scores, keep mask or None, scaled q, scale), exactly as the decomposition builds them."""
    q, k = ins[0], ins[1]
    kind = attrs["mask"]
    dt = q.dtype
    r = q.rank
    scale = float(attrs["scale"]) if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])  # type: ignore[arg-type]
    qs = q * b.const(scale, dt)
    s = b.op("matmul", qs, swap_last(b, k))
    sq, sk = s.shape[-2], s.shape[-1]
    keep = None
    if kind in ("causal", "sliding_window"):
        i = b.op("iota", shape=(sq, sk), axis=0, dtype=DType.I64)
        j = b.op("iota", shape=(sq, sk), axis=1, dtype=DType.I64)
        keep = b.op("less_equal", j, i)
        if kind == "sliding_window":
            lo = i - b.const(int(attrs["window"]), DType.I64)  # type: ignore[arg-type]
            keep = b.op("logical_and", keep, b.op("greater", j, lo))
    elif kind == "padding":
        m = ins[3]
        keep = m if m.dtype is DType.BOOL else b.op("not_equal", m, b.const(0, m.dtype))
        keep = b.op("reshape", keep, shape=(m.shape[0],) + (1,) * (r - 2) + (m.shape[1],))
    if keep is not None:
        s = b.op("where", keep, s, b.const(masked_score(dt), dt))
    elif kind == "bias":
        s = s + ins[3]
    return s, keep, qs, scale


@register_vjp("attention")
def _attention_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                   attrs: Attrs) -> list:
    g = cts[0]
    if g is None:
        return [None] * len(ins)
    k, v = ins[1], ins[2]
    s, keep, qs, scale = _attention_scores(b, ins, attrs)
    p = b.op("softmax", s, axis=-1)
    dv = b.op("matmul", swap_last(b, p), g)
    dp = b.op("matmul", g, swap_last(b, v))
    ds = p * (dp - _sum_keep(b, dp * p, (p.rank - 1,)))
    if keep is not None:
        ds = b.op("where", keep, ds, _c(b, 0.0, ds))
    dq = b.op("matmul", ds, k) * b.const(scale, ds.dtype)
    dk = b.op("matmul", swap_last(b, ds), qs)
    res: list[Tensor | None] = [dq, dk, dv]
    if len(ins) == 4:
        res.append(sum_to(b, ds, ins[3].shape) if attrs["mask"] == "bias" else None)
    return res


# -- conv2d_bias / embedding ---------------------------------------------------------------------

@register_vjp("conv2d_bias")
def _conv_bias_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                   attrs: Attrs) -> list:
    g = cts[0]
    x, w, _ = ins
    if g is None:
        return [None, None, None]
    return [conv_input_grad(b, g, w, x.shape, attrs), conv_weight_grad(b, x, g, w.shape, attrs),
            b.op("reduce_sum", g, axes=(0, 2, 3), keepdims=False)]


@register_jvp("conv2d_bias")
def _conv_bias_jvp(b: B, ins: Ts, outs: Ts, ts: Cts,
                   attrs: Attrs) -> list:
    tx, tw, tb = ts
    x, w, _ = ins
    a = dict(attrs)
    # name=None: a fresh node name (the attributes never hold one)
    parts = ([b.op("conv2d", tx, w, name=None, **a)] if tx is not None else []) + \
            ([b.op("conv2d", x, tw, name=None, **a)] if tw is not None else [])
    if tb is not None:
        tb = reshape(b, tb, (w.shape[0], 1, 1))
        parts.append(tb if parts else b.op("expand", tb, shape=outs[0].shape))
    return [_add_all(parts)]


@register_vjp("embedding")
def _embedding_vjp(b: B, ins: Ts, outs: Ts, cts: Cts,
                   attrs: Attrs) -> list:
    g = cts[0]
    if g is None:
        return [None, None]
    return [gather_transpose(b, g, ins[0], ins[1], 0), None]


@register_jvp("embedding")
def _embedding_jvp(b: B, ins: Ts, outs: Ts, ts: Cts,
                   attrs: Attrs) -> list:
    t = ts[0]
    return [None if t is None else b.op("embedding", t, ins[1])]

