"""Autodiff as IR transformations: every rule against central finite differences in float64 (reverse
and forward mode), the derivative graphs on the CPU backend, and vjp/jvp/hvp/vmap against NumPy and
torch.func."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.autodiff import (
    VJP_RULES,
    Trace,
    get_jvp,
    get_vjp,
    grad,
    hvp,
    jvp,
    params_as_inputs,
    register_vjp,
    value_and_grad,
    vjp,
    vmap,
)
from rlx_core.errors import IRError
from rlx_core.ir import REGISTRY, OpSchema, TensorType
from rlx_core.ir.graph import Graph
from rlx_core.ir.hir import HIR_OPS
from rlx_core.ir.reference import evaluate
from rlx_core.losses import mse, softmax_cross_entropy

F64 = "f64"
EPS = 1e-6


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# The gradient checker


@dataclass
class Case:
    id: str
    fn: Callable[..., Any]
    inputs: dict[str, np.ndarray]
    shapes: dict[str, tuple] = field(default_factory=dict)  # declared (possibly symbolic) shapes
    cpu: bool = True


def _model(case: Case) -> tuple[Graph, list[str], dict[str, np.ndarray]]:
    """The case's op(s) followed by a scalar loss = sum_k sum(out_k * r_k), with random weights
    r_k fed as extra inputs (so symbolic shapes work); returns (graph, wrt, feeds)."""
    g = GraphBuilder(case.id.replace("-", "_"))
    ts = {}
    for name, arr in case.inputs.items():
        dt = "i64" if arr.dtype.kind in "iu" else ("bool" if arr.dtype == bool else F64)
        ts[name] = g.input(name, dt, case.shapes.get(name, arr.shape))
    outs = case.fn(g, **ts)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    rng = _rng(1)
    feeds = dict(case.inputs)
    total = None
    for k, o in enumerate(outs):
        feeds[f"r{k}_"] = rng.standard_normal(_concrete_shape(o.shape, case))
        term = g.op("reduce_sum", o * g.input(f"r{k}_", F64, o.shape), axes=None, keepdims=False)
        total = term if total is None else total + term
    g.output(total, "loss")
    wrt = [n for n, a in case.inputs.items() if a.dtype.kind == "f"]
    return g.build(), wrt, feeds


def _concrete_shape(shape: tuple, case: Case) -> tuple:
    if all(isinstance(d, int) for d in shape):
        return shape
    # bind symbols from the declared vs actual input shapes
    binding = {}
    for name, arr in case.inputs.items():
        for d, n in zip(case.shapes.get(name, arr.shape), arr.shape):
            if isinstance(d, str):
                binding[d] = n
    return tuple(binding.get(d, d) for d in shape)


def _loss(graph: Graph, feeds: dict[str, np.ndarray]) -> float:
    return float(evaluate(graph, feeds, round_intermediates=False)["loss"])


def _fd_grad(graph: Graph, feeds: dict[str, np.ndarray], name: str) -> np.ndarray:
    x = feeds[name]
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += EPS
        xm[i] -= EPS
        out[i] = (_loss(graph, {**feeds, name: xp}) - _loss(graph, {**feeds, name: xm})) / (2 * EPS)
    return out


def _close(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def check_case(case: Case) -> None:
    graph, wrt, feeds = _model(case)
    # reverse mode
    gg = grad(graph, "loss", wrt)
    assert gg.outputs == ("loss", *[f"grad_{w}" for w in wrt])
    ref = evaluate(gg, feeds, round_intermediates=False)
    for w in wrt:
        _close(ref[f"grad_{w}"], _fd_grad(graph, feeds, w), f"{case.id}: d loss / d {w}")
    # forward mode: the directional derivative along a random tangent
    rng = _rng(2)
    tangents = {w: rng.standard_normal(feeds[w].shape) for w in wrt}
    jg = jvp(graph, wrt)
    jref = evaluate(jg, {**feeds, **{f"tangent_{w}": t for w, t in tangents.items()}},
                    round_intermediates=False)
    plus = {**feeds, **{w: feeds[w] + EPS * tangents[w] for w in wrt}}
    minus = {**feeds, **{w: feeds[w] - EPS * tangents[w] for w in wrt}}
    fd = (_loss(graph, plus) - _loss(graph, minus)) / (2 * EPS)
    _close(jref["tangent_loss"], fd, f"{case.id}: jvp")
    # and reverse == forward: <grad, t> == jvp(t)
    dot = sum(float(np.sum(ref[f"grad_{w}"] * tangents[w])) for w in wrt)
    _close(jref["tangent_loss"], dot, f"{case.id}: <grad, t> vs jvp", rtol=1e-9, atol=1e-9)
    if case.cpu:  # the derivative graphs compile and run on the CPU backend
        s = Session("cpu", use_cache=False)
        got = s.compile(gg).run(feeds)
        for k, v in ref.items():
            _close(got[k], v, f"{case.id}: cpu {k}", rtol=1e-9, atol=1e-10)
        jgot = s.compile(jg).run({**feeds, **{f"tangent_{w}": t for w, t in tangents.items()}})
        _close(jgot["tangent_loss"], jref["tangent_loss"], f"{case.id}: cpu jvp", rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Cases: every MIR op, every HIR op, representative attributes


def _r(*shape: int, seed: int = 0, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    rng = _rng(seed)
    if lo is not None:
        return rng.uniform(lo, hi, shape)
    return rng.standard_normal(shape)


def _away(*shape: int, seed: int = 0) -> np.ndarray:
    """Values bounded away from 0 (for abs, sign, reciprocal)."""
    rng = _rng(seed)
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def _distinct(*shape: int, seed: int = 0) -> np.ndarray:
    """Values with pairwise gaps >= 0.1 (max/min/pools have no ties)."""
    rng = _rng(seed)
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.1 - n * 0.05).reshape(shape) + 0.013


def _unary(op: str, x: np.ndarray) -> Case:
    return Case(f"mir-{op}", lambda g, x: g.op(op, x), {"x": x})


CASES: list[Case] = [
    _unary("neg", _r(2, 3)),
    _unary("abs", _away(2, 3)),
    _unary("exp", _r(2, 3)),
    _unary("log", _r(2, 3, lo=0.5, hi=2.0)),
    _unary("sqrt", _r(2, 3, lo=0.5, hi=2.0)),
    _unary("rsqrt", _r(2, 3, lo=0.5, hi=2.0)),
    _unary("reciprocal", _away(2, 3)),
    _unary("sin", _r(2, 3)),
    _unary("cos", _r(2, 3)),
    _unary("tanh", _r(2, 3)),
    _unary("sigmoid", _r(2, 3)),
    _unary("erf", _r(2, 3)),
    Case("mir-sign-floor-ceil-round", lambda g, x: (g.op("sign", x) * x, g.op("floor", x) * x,
                                                    g.op("ceil", x), g.op("round", x) + x),
         {"x": np.array([[-1.7, -0.3, 0.4], [1.2, 2.6, -2.2]])}),
    Case("mir-add-broadcast", lambda g, a, b: a + b, {"a": _r(2, 3), "b": _r(3, seed=1)}),
    Case("mir-sub-broadcast", lambda g, a, b: a - b, {"a": _r(2, 1, 3), "b": _r(4, 1, seed=1)}),
    Case("mir-mul-broadcast", lambda g, a, b: a * b, {"a": _r(2, 3), "b": _r(1, 3, seed=1)}),
    Case("mir-div-broadcast", lambda g, a, b: a / b, {"a": _r(2, 3), "b": _away(3, seed=1)}),
    Case("mir-pow", lambda g, a, b: g.op("pow", a, b),
         {"a": _r(2, 3, lo=0.5, hi=2.0), "b": _r(3, seed=1)}),
    Case("mir-pow-square", lambda g, a: a ** 2.0, {"a": _r(2, 3)}),
    Case("mir-maximum", lambda g, a, b: g.op("maximum", a, b),
         {"a": _distinct(2, 3), "b": _r(3, seed=1) + 0.05}),
    Case("mir-minimum", lambda g, a, b: g.op("minimum", a, b),
         {"a": _distinct(2, 3), "b": _r(2, 1, seed=1) + 0.05}),
    Case("mir-where", lambda g, a, b, c: g.op("where", c > g.const(0.0, F64), a, b),
         {"a": _r(2, 3), "b": _r(3, seed=1), "c": _r(2, 1, seed=2)}),
    Case("mir-cast-to-int-is-constant",
         lambda g, x: x * g.op("cast", g.op("cast", x * 3.0, to="i64"), to=F64),
         {"x": np.array([0.1, 0.5, 1.3, -0.7])}),
    Case("mir-reduce_sum", lambda g, x: g.op("reduce_sum", x, axes=(0,), keepdims=False), {"x": _r(2, 3, 4)}),
    Case("mir-reduce_sum-all-keepdims", lambda g, x: g.op("reduce_sum", x, axes=None, keepdims=True),
         {"x": _r(2, 3)}),
    Case("mir-reduce_mean-neg-axes", lambda g, x: g.op("reduce_mean", x, axes=(-1, 0), keepdims=True),
         {"x": _r(2, 3, 4)}),
    Case("mir-reduce_prod-with-zeros", lambda g, x: g.op("reduce_prod", x, axes=(1,), keepdims=False),
         {"x": np.array([[0.5, -1.2, 2.0, 0.7], [0.0, 1.5, -0.8, 1.1], [0.0, 0.0, 1.3, 0.9]])}),
    Case("mir-reduce_prod-all", lambda g, x: g.op("reduce_prod", x, axes=None, keepdims=False),
         {"x": _r(2, 3, lo=0.5, hi=1.5)}),
    Case("mir-reduce_max", lambda g, x: g.op("reduce_max", x, axes=(-1,), keepdims=False),
         {"x": _distinct(3, 4)}),
    Case("mir-reduce_min-keepdims", lambda g, x: g.op("reduce_min", x, axes=(0, 2), keepdims=True),
         {"x": _distinct(2, 3, 2)}),
    Case("mir-argmax-argmin-no-gradient",
         lambda g, x: x * g.op("cast", g.op("argmax", x, axis=1, keepdims=True)
                               + g.op("argmin", x, axis=1, keepdims=True), to=F64),
         {"x": _distinct(3, 4)}),
    Case("mir-matmul", lambda g, a, b: a @ b, {"a": _r(2, 3), "b": _r(3, 4, seed=1)}),
    Case("mir-matmul-batch-broadcast", lambda g, a, b: a @ b,
         {"a": _r(2, 1, 3, 4), "b": _r(3, 4, 2, seed=1)}),
    Case("mir-matmul-3d-2d", lambda g, a, b: a @ b, {"a": _r(2, 3, 4), "b": _r(4, 2, seed=1)}),
    Case("mir-matmul-1d-2d", lambda g, a, b: a @ b, {"a": _r(3), "b": _r(3, 4, seed=1)}),
    Case("mir-matmul-2d-1d", lambda g, a, b: a @ b, {"a": _r(2, 3), "b": _r(3, seed=1)}),
    Case("mir-matmul-1d-1d", lambda g, a, b: a @ b, {"a": _r(3), "b": _r(3, seed=1)}),
    Case("mir-matmul-1d-3d", lambda g, a, b: a @ b, {"a": _r(3), "b": _r(2, 3, 4, seed=1)}),
    Case("mir-reshape", lambda g, x: g.op("reshape", x, shape=(4, -1)), {"x": _r(2, 3, 4)}),
    Case("mir-transpose",
         lambda g, x: (g.op("transpose", x, perm=(2, 0, 1)), g.op("transpose", x, perm=None)),
         {"x": _r(2, 3, 4)}),
    Case("mir-expand", lambda g, x: g.op("expand", x, shape=(2, 3, 4)), {"x": _r(3, 1)}),
    Case("mir-slice-steps",
         lambda g, x: g.op("slice", x, starts=(0, 1), stops=(5, 100), axes=(0, -1), steps=(2, 3)),
         {"x": _r(5, 8)}),
    Case("mir-slice-negative-steps",
         lambda g, x: (g.op("slice", x, starts=(-1,), stops=(-100,), axes=(1,), steps=(-2,)),
                       g.op("slice", x, starts=(3, -2), stops=(0, 1), axes=(0, 1), steps=(-1, -1))),
         {"x": _r(5, 7)}),
    Case("mir-slice-negative-start", lambda g, x: g.op("slice", x, starts=(-3,), stops=(-1,), axes=(0,)),
         {"x": _r(6, 2)}),
    Case("mir-concat", lambda g, a, b, c: g.op("concat", a, b, c, axis=-1),
         {"a": _r(2, 2), "b": _r(2, 3, seed=1), "c": _r(2, 1, seed=2)}),
    Case("mir-pad", lambda g, x: g.op("pad", x, pads=(1, 0, 2, 3), value=1.5), {"x": _r(2, 3)}),
    Case("mir-gather-repeated", lambda g, x, i: g.op("gather", x, i, axis=1),
         {"x": _r(3, 4), "i": np.array([2, 0, 2, 2, -1])}),
    Case("mir-gather-2d-indices", lambda g, x, i: g.op("gather", x, i, axis=0),
         {"x": _r(4, 3), "i": np.array([[1, 1], [3, 0], [1, 2]])}),
    Case("mir-gather-scalar-index", lambda g, x, i: g.op("gather", x, i, axis=-1),
         {"x": _r(3, 4), "i": np.array(2)}),
    Case("mir-scatter_add", lambda g, x, i, u: g.op("scatter_add", x, i, u, axis=1),
         {"x": _r(3, 4), "i": np.array([[0, 0, 3], [1, -1, 1], [2, 2, 2]]), "u": _r(3, 3, seed=1)}),
    Case("mir-scatter_add-axis0-smaller", lambda g, x, i, u: g.op("scatter_add", x, i, u, axis=0),
         {"x": _r(4, 3), "i": np.array([[3, 0], [3, 3]]), "u": _r(2, 2, seed=1)}),
    Case("mir-conv2d", lambda g, x, w: g.op("conv2d", x, w),
         {"x": _r(2, 3, 5, 5), "w": _r(4, 3, 3, 3, seed=1)}),
    Case("mir-conv2d-stride-pad-dilation",
         lambda g, x, w: g.op("conv2d", x, w, strides=(2, 3), pads=(1, 2, 0, 1), dilations=(2, 1)),
         {"x": _r(1, 2, 7, 8), "w": _r(3, 2, 2, 3, seed=1)}),
    Case("mir-conv2d-groups",
         lambda g, x, w: g.op("conv2d", x, w, groups=2, pads=(1, 1, 1, 1), strides=(2, 2)),
         {"x": _r(2, 4, 5, 5), "w": _r(6, 2, 3, 3, seed=1)}),
    Case("mir-conv2d-depthwise-big-pad",
         lambda g, x, w: g.op("conv2d", x, w, groups=3, pads=(3, 0, 2, 3), strides=(1, 2), dilations=(1, 2)),
         {"x": _r(1, 3, 4, 6), "w": _r(3, 1, 2, 2, seed=1)}),
    Case("mir-conv2d-1x1", lambda g, x, w: g.op("conv2d", x, w, strides=(2, 2)),
         {"x": _r(2, 3, 4, 4), "w": _r(2, 3, 1, 1, seed=1)}),
    Case("mir-cumsum", lambda g, x: g.op("cumsum", x, axis=0), {"x": _r(4, 3)}),
    Case("mir-cumsum-exclusive-reverse",
         lambda g, x: g.op("cumsum", x, axis=-1, exclusive=True, reverse=True),
         {"x": _r(3, 5)}),
    Case("mir-iota-constant", lambda g, x: x * g.op("cast", g.op("iota", shape=(2, 3), axis=1), to=F64),
         {"x": _r(2, 3)}),
    # HIR ops
    Case("hir-linear", lambda g, x, w, b: g.op("linear", x, w, b),
         {"x": _r(2, 3, 4), "w": _r(5, 4, seed=1), "b": _r(5, seed=2)}),
    Case("hir-linear-1d", lambda g, x, w, b: g.op("linear", x, w, b),
         {"x": _r(4), "w": _r(5, 4, seed=1), "b": _r(5, seed=2)}),
    Case("hir-layer_norm", lambda g, x, s, b: g.op("layer_norm", x, s, b),
         {"x": _r(3, 5), "s": _r(5, seed=1), "b": _r(5, seed=2)}),
    Case("hir-layer_norm-axis", lambda g, x, s, b: g.op("layer_norm", x, s, b, axis=-2, eps=1e-3),
         {"x": _r(2, 3, 4), "s": _r(3, 4, seed=1), "b": _r(3, 4, seed=2)}),
    Case("hir-rms_norm", lambda g, x, s: g.op("rms_norm", x, s), {"x": _r(3, 5), "s": _r(5, seed=1)}),
    Case("hir-softmax", lambda g, x: g.op("softmax", x, axis=0), {"x": _r(3, 4)}),
    Case("hir-log_softmax", lambda g, x: g.op("log_softmax", x, axis=-1), {"x": _r(3, 4)}),
    Case("hir-relu", lambda g, x: g.op("relu", x), {"x": _away(3, 4)}),
    Case("hir-gelu", lambda g, x: g.op("gelu", x), {"x": _r(3, 4) * 2}),
    Case("hir-gelu-tanh", lambda g, x: g.op("gelu", x, approximate="tanh"), {"x": _r(3, 4) * 2}),
    Case("hir-silu", lambda g, x: g.op("silu", x), {"x": _r(3, 4) * 2}),
    Case("hir-attention", lambda g, q, k, v: g.op("attention", q, k, v),
         {"q": _r(2, 3, 4), "k": _r(2, 5, 4, seed=1), "v": _r(2, 5, 3, seed=2)}),
    Case("hir-attention-causal-4d", lambda g, q, k, v: g.op("attention", q, k, v, mask="causal", scale=0.3),
         {"q": _r(1, 2, 3, 2), "k": _r(1, 2, 3, 2, seed=1), "v": _r(1, 2, 3, 2, seed=2)}),
    Case("hir-attention-sliding",
         lambda g, q, k, v: g.op("attention", q, k, v, mask="sliding_window", window=2),
         {"q": _r(1, 4, 2), "k": _r(1, 4, 2, seed=1), "v": _r(1, 4, 3, seed=2)}),
    Case("hir-attention-bias", lambda g, q, k, v, m: g.op("attention", q, k, v, m, mask="bias"),
         {"q": _r(2, 3, 2), "k": _r(2, 4, 2, seed=1), "v": _r(2, 4, 2, seed=2), "m": _r(3, 4, seed=3)}),
    Case("hir-attention-padding", lambda g, q, k, v, m: g.op("attention", q, k, v, m, mask="padding"),
         {"q": _r(2, 3, 2), "k": _r(2, 4, 2, seed=1), "v": _r(2, 4, 2, seed=2),
          "m": np.array([[1, 1, 0, 1], [0, 0, 0, 0]])}),
    Case("hir-conv2d_bias", lambda g, x, w, b: g.op("conv2d_bias", x, w, b, groups=2, pads=(1, 0, 1, 0)),
         {"x": _r(1, 4, 4, 3), "w": _r(2, 2, 3, 2, seed=1), "b": _r(2, seed=2)}),
    Case("hir-batch_norm", lambda g, x, s, b, m, v: g.op("batch_norm", x, s, b, m, v),
         {"x": _r(2, 3, 2), "s": _r(3, seed=1), "b": _r(3, seed=2), "m": _r(3, seed=3),
          "v": _r(3, seed=4, lo=0.5, hi=1.5)}),
    Case("hir-max_pool2d",
         lambda g, x: g.op("max_pool2d", x, kernel=(2, 3), strides=(1, 2), pads=(1, 1, 0, 1)),
         {"x": _distinct(1, 2, 4, 5)}),
    Case("hir-avg_pool2d",
         lambda g, x: g.op("avg_pool2d", x, kernel=(3, 2), strides=(2, 1), pads=(1, 0, 1, 1),
                           count_include_pad=False),
         {"x": _r(1, 2, 5, 4)}),
    Case("hir-embedding", lambda g, t, i: g.op("embedding", t, i),
         {"t": _r(5, 3), "i": np.array([[1, 4, 1], [0, 1, 4]])}),
    # symbolic dims: the shapes of derivatives stay symbolic
    Case("sym-mean-over-batch", lambda g, x, w: g.op("reduce_mean", g.op("tanh", x @ w), axes=None),
         {"x": _r(3, 4), "w": _r(4, 2, seed=1)}, shapes={"x": ("batch", 4)}),
    Case("sym-embedding", lambda g, t, i: g.op("embedding", t, i),
         {"t": _r(5, 3), "i": np.array([[1, 4, 1], [0, 1, 4]])}, shapes={"i": ("batch", 3)}),
    Case("sym-scatter_add", lambda g, x, i, u: g.op("scatter_add", x, i, u, axis=1),
         {"x": _r(3, 4), "i": np.array([[0, 0, 3], [1, -1, 1], [2, 2, 2]]), "u": _r(3, 3, seed=1)},
         shapes={"x": ("n", 4), "i": ("n", 3), "u": ("n", 3)}),
    Case("sym-conv2d-groups", lambda g, x, w: g.op("conv2d", x, w, groups=2, strides=(2, 1)),
         {"x": _r(2, 4, 5, 4), "w": _r(4, 2, 2, 2, seed=1)}, shapes={"x": ("batch", 4, 5, 4)}),
    Case("sym-layer_norm-linear", lambda g, x, w, b, s, c: g.op("layer_norm", g.op("linear", x, w, b), s, c),
         {"x": _r(2, 3, 4), "w": _r(5, 4, seed=1), "b": _r(5, seed=2), "s": _r(5, seed=3),
          "c": _r(5, seed=4)},
         shapes={"x": ("batch", "seq", 4)}),
    Case("sym-losses", lambda g, x, y, t: (softmax_cross_entropy(g, x, y), mse(g, x, t)),
         {"x": _r(4, 3), "y": np.array([0, 2, 1, 2]), "t": _r(4, 3, seed=1)},
         shapes={"x": ("batch", 3), "y": ("batch",), "t": ("batch", 3)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradcheck(case: Case) -> None:
    check_case(case)


def test_every_op_has_rules_or_a_decomposition() -> None:
    for schema in REGISTRY.schemas():
        if schema.provider != "rlx-core" or not schema.differentiable:
            continue  # a non-differentiable op's gradient request raises, naming it
        if schema.level == "mir" and schema.category == "splat":
            # Reverse mode only (scene fitting); checked by finite differences in tests/test_splat.py.
            assert get_vjp(schema.name) is not None or schema.name.endswith("_grad"), schema.name
        elif schema.level == "mir":
            assert get_vjp(schema.name) is not None and get_jvp(schema.name) is not None, schema.name
        else:
            assert get_vjp(schema.name) is not None or schema.decompose is not None
    tested = {c.id.split("-")[1] for c in CASES if c.id.startswith(("mir-", "hir-"))}
    for name in HIR_OPS:
        assert name in tested, f"HIR op {name} has no gradient check"
    mir_in_cases = set()
    for c in CASES:
        graph, _, _ = _model(c)
        mir_in_cases |= set(graph.op_counts())
    # Collectives' rules are checked against finite differences over simulated ranks instead
    # (tests/test_distributed.py): one process cannot run them here.
    collective = {s.name for s in REGISTRY.schemas() if s.extra.get("collective")}
    # Linear algebra's gradients (solve, cholesky, eigh) are checked in tests/test_linalg.py and the
    # splatting ops' in tests/test_splat.py; the sparse ops and the other factorizations are not
    # differentiable (asking raises, naming the op).
    own_checks = {s.name for s in REGISTRY.schemas("mir") if s.category in ("sparse", "linalg", "splat")}
    # Integer-only ops (bitwise_*) are declared not differentiable: asking for a gradient raises.
    own_checks |= {s.name for s in REGISTRY.schemas("mir") if not s.differentiable}
    untested = {n for n in REGISTRY.names("mir")} - mir_in_cases - collective - own_checks - {
        "logical_and", "logical_or", "logical_xor", "logical_not", "equal", "not_equal", "less",
        "less_equal", "greater_equal"}  # boolean-valued: no derivative by construction
    assert not untested, f"MIR ops without a gradient check: {sorted(untested)}"


def test_tie_conventions_match_torch() -> None:
    torch = pytest.importorskip("torch")
    a = np.array([[1.0, 2.0, 3.0, 3.0], [0.0, -1.0, 5.0, 5.0]])
    c = np.array([[1.0, 0.0, 3.0, 4.0], [0.0, 2.0, 5.0, 1.0]])
    g = GraphBuilder("ties")
    x, y = g.input("a", F64, a.shape), g.input("c", F64, c.shape)
    r = g.const(np.arange(8.0).reshape(2, 4) + 1, F64)
    t = g.op("maximum", x, y) * r + g.op("minimum", x, y) * r
    m = g.op("reduce_max", x, axes=(1,)) * g.const([2.0, 3.0], F64)
    t = g.op("reduce_sum", t, axes=None) + g.op("reduce_sum", m, axes=None)
    t = t + g.op("reduce_sum", g.op("abs", x - y), axes=None)
    g.output(t, "loss")
    out = evaluate(grad(g.build(), "loss", ["a", "c"]), {"a": a, "c": c})
    ta, tc = torch.tensor(a, requires_grad=True), torch.tensor(c, requires_grad=True)
    rr = torch.arange(8.0, dtype=torch.float64).reshape(2, 4) + 1
    tl = ((torch.maximum(ta, tc) + torch.minimum(ta, tc)) * rr).sum() \
        + (torch.amax(ta, dim=1) * torch.tensor([2.0, 3.0], dtype=torch.float64)).sum() \
        + (ta - tc).abs().sum()
    tl.backward()
    np.testing.assert_allclose(out["grad_a"], ta.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(out["grad_c"], tc.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_low_precision_gradients_run_on_cpu(dtype: str) -> None:
    g = GraphBuilder("lp")
    x = g.input("x", dtype, ("batch", 8))
    w = g.param("w", _r(8, 4).astype(np.float32), dtype=dtype)
    h = g.op("layer_norm", x @ w, g.const(np.ones(4), dtype), g.const(np.zeros(4), dtype))
    g.output(g.op("reduce_mean", g.op("gelu", g.op("softmax", h)), axes=None), "loss")
    gg = grad(g.build(), "loss", ["w", "x"])
    assert gg.types["grad_w"].dtype.value == dtype
    xv = _r(3, 8, seed=1).astype(gg.inputs[0].type.dtype.np)
    got = Session("cpu", use_cache=False).compile(gg).run(x=xv)
    ref = evaluate(gg, {"x": xv})
    scale = np.abs(ref["grad_w"]).max()
    np.testing.assert_allclose(got["grad_w"].astype(np.float64), ref["grad_w"], atol=0.02 * scale)


def test_cast_gradient_goes_back_to_the_source_dtype() -> None:
    g = GraphBuilder("cast")
    x = g.input("x", F64, (3,))
    y = g.op("cast", x, to="f32") * g.const([1.0, 2.0, 3.0], "f32")
    g.output(g.op("reduce_sum", g.op("cast", y, to=F64), axes=None), "loss")
    gg = grad(g.build(), "loss", "x")
    assert gg.types["grad_x"] == TensorType("f64", (3,))
    np.testing.assert_array_equal(evaluate(gg, {"x": np.ones(3)})["grad_x"], [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------------------------
# The transforms


def _mlp(rng_seed: int = 0, batch: Any = "batch") -> Graph:
    rng = _rng(rng_seed)
    g = GraphBuilder("mlp")
    x = g.input("x", F64, (batch, 4))
    y = g.input("y", "i64", (batch,))
    w1 = g.param("w1", rng.standard_normal((4, 6)))
    b1 = g.param("b1", rng.standard_normal(6) * 0.1)
    w2 = g.param("w2", rng.standard_normal((6, 3)))
    h = g.op("tanh", x @ w1 + b1)
    h = g.op("layer_norm", h, g.const(np.linspace(0.5, 1.5, 6), F64), g.const(np.zeros(6), F64))
    logits = g.op("gelu", h) @ w2
    g.output(logits, "logits")
    g.output(softmax_cross_entropy(g, logits, y), "loss")
    return g.build()


def _torch_mlp(torch: Any, graph: Graph, x: np.ndarray, y: np.ndarray) -> Callable[..., Any]:
    gamma = torch.tensor(np.linspace(0.5, 1.5, 6))

    def f(w1: Any, b1: Any, w2: Any) -> Any:
        h = torch.tanh(torch.tensor(x) @ w1 + b1)
        h = torch.nn.functional.layer_norm(h, (6,), gamma, torch.zeros(6, dtype=torch.float64))
        logits = torch.nn.functional.gelu(h) @ w2
        return torch.nn.functional.cross_entropy(logits, torch.tensor(y))
    return f


def test_grad_against_torch_and_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    graph = _mlp()
    rng = _rng(5)
    x, y = rng.standard_normal((5, 4)), rng.integers(0, 3, 5)
    gg = grad(graph, "loss", ["w1", "b1", "w2"])
    assert [v.name for v in gg.inputs] == ["x", "y"]
    assert {p.name for p in graph.params} <= {p.name for p in gg.params}
    got = Session("cpu", use_cache=False).compile(gg).run(x=x, y=y)
    ws = [torch.tensor(np.array(graph.weights[n]), requires_grad=True) for n in ("w1", "b1", "w2")]
    loss = _torch_mlp(torch, graph, x, y)(*ws)
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12)
    for n, w in zip(("w1", "b1", "w2"), ws):
        np.testing.assert_allclose(got[f"grad_{n}"], w.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_params_as_inputs_and_value_and_grad() -> None:
    graph = _mlp()
    rng = _rng(6)
    x, y = rng.standard_normal((3, 4)), rng.integers(0, 3, 3)
    moved = params_as_inputs(graph, ["w2", "w1"])
    assert [v.name for v in moved.inputs] == ["x", "y", "w2", "w1"]
    assert "w1" not in moved.weights and "b1" in moved.weights
    vg = value_and_grad(graph, "loss", ["w1", "x"], params_to_inputs=True)
    assert vg.outputs == ("logits", "loss", "grad_w1", "grad_x")
    assert [v.name for v in vg.inputs] == ["x", "y", "w1"]
    ref = evaluate(grad(graph, "loss", ["w1", "x"]), {"x": x, "y": y})
    w1 = np.array(graph.weights["w1"])
    got = Session("cpu", use_cache=False).compile(vg).run(x=x, y=y, w1=w1)
    np.testing.assert_allclose(got["grad_w1"], ref["grad_w1"], rtol=1e-12)
    np.testing.assert_allclose(got["logits"], evaluate(graph, {"x": x, "y": y})["logits"], rtol=1e-12)
    # feeding other parameter values changes the result: the runtime sees them as inputs
    got2 = Session("cpu", use_cache=False).compile(vg).run(x=x, y=y, w1=w1 * 2)
    assert not np.allclose(got2["loss"], got["loss"])


def test_grad_wrt_intermediate_and_unused_values() -> None:
    g = GraphBuilder("mid")
    x = g.input("x", F64, (3,))
    z = g.input("z", F64, (2,))
    h = g.op("exp", x)
    g.output(g.op("reduce_sum", h * h, axes=None), "loss")
    g.output(z, "z_out")
    graph = g.build()
    gg = grad(graph, "loss", ["x", h.name, "z"])
    xv = np.array([0.1, -0.2, 0.3])
    out = evaluate(gg, {"x": xv, "z": np.ones(2)})
    np.testing.assert_allclose(out[f"grad_{h.name}"], 2 * np.exp(xv))
    np.testing.assert_allclose(out["grad_x"], 2 * np.exp(2 * xv))
    np.testing.assert_array_equal(out["grad_z"], np.zeros(2))


def test_grad_errors() -> None:
    graph = _mlp()
    with pytest.raises(IRError, match="single element"):
        grad(graph, "logits", ["w1"])
    with pytest.raises(IRError, match="only floating"):
        grad(graph, "loss", ["y"])
    with pytest.raises(IRError, match="not a value"):
        grad(graph, "loss", ["nope"])


def test_vjp_against_torch_func() -> None:
    torch = pytest.importorskip("torch")
    rng = _rng(7)
    g = GraphBuilder("f")
    a = g.input("a", F64, (3, 4))
    b = g.input("b", F64, (4, 2))
    y = g.op("softmax", g.op("sin", a) @ b, axis=0)
    g.output(y, "y")
    g.output(g.op("reduce_sum", a * a, axes=(1,)), "s")
    graph = g.build()
    vg = vjp(graph, ["y", "s"], ["a", "b"])
    assert [v.name for v in vg.inputs] == ["a", "b", "cotangent_y", "cotangent_s"]
    av, bv, cy, cs = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)), rng.standard_normal((3, 2)), \
        rng.standard_normal(3)
    out = Session("cpu", use_cache=False).compile(vg).run(a=av, b=bv, cotangent_y=cy, cotangent_s=cs)

    def f(a: Any, b: Any) -> Any:
        return torch.softmax(torch.sin(a) @ b, 0), (a * a).sum(1)

    prim, fn = torch.func.vjp(f, torch.tensor(av), torch.tensor(bv))
    da, db = fn((torch.tensor(cy), torch.tensor(cs)))
    np.testing.assert_allclose(out["y"], prim[0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["grad_a"], da.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["grad_b"], db.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_against_torch_func() -> None:
    torch = pytest.importorskip("torch")
    rng = _rng(8)
    g = GraphBuilder("f")
    q = g.input("q", F64, (2, 3, 4))
    k = g.input("k", F64, (2, 5, 4))
    v = g.input("v", F64, (2, 5, 4))
    o = g.op("attention", q, k, v, mask="causal")
    g.output(g.op("rms_norm", o, g.const(np.ones(4) * 1.5, F64)), "out")
    graph = g.build()
    jg = jvp(graph, ["q", "k", "v"])
    assert jg.outputs == ("out", "tangent_out")
    xs = [rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 4))]
    ts = [rng.standard_normal(x.shape) for x in xs]
    out = Session("cpu", use_cache=False).compile(jg).run(
        q=xs[0], k=xs[1], v=xs[2], tangent_q=ts[0], tangent_k=ts[1], tangent_v=ts[2])

    def f(q: Any, k: Any, v: Any) -> Any:
        mask = torch.ones(3, 5, dtype=torch.bool).tril()
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o * torch.rsqrt((o * o).mean(-1, keepdim=True) + 1e-6) * 1.5

    prim, tan = torch.func.jvp(f, tuple(torch.tensor(x) for x in xs), tuple(torch.tensor(t) for t in ts))
    np.testing.assert_allclose(out["out"], prim.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["tangent_out"], tan.numpy(), rtol=1e-9, atol=1e-11)


def test_hvp_against_torch_func() -> None:
    torch = pytest.importorskip("torch")
    graph = _mlp()
    rng = _rng(9)
    x, y = rng.standard_normal((5, 4)), rng.integers(0, 3, 5)
    hg = hvp(graph, "loss", ["w1", "w2"])
    assert hg.outputs == ("loss", "grad_w1", "grad_w2", "hvp_w1", "hvp_w2")
    t1, t2 = rng.standard_normal((4, 6)), rng.standard_normal((6, 3))
    out = Session("cpu", use_cache=False).compile(hg).run(x=x, y=y, tangent_w1=t1, tangent_w2=t2)
    f = _torch_mlp(torch, graph, x, y)
    b1 = torch.tensor(np.array(graph.weights["b1"]))

    def gfun(w1: Any, w2: Any) -> Any:
        return torch.func.grad(lambda a, c: f(a, b1, c), argnums=(0, 1))(w1, w2)

    w = (torch.tensor(np.array(graph.weights["w1"])), torch.tensor(np.array(graph.weights["w2"])))
    _, hv = torch.func.jvp(gfun, w, (torch.tensor(t1), torch.tensor(t2)))
    np.testing.assert_allclose(out["hvp_w1"], hv[0].numpy(), rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(out["hvp_w2"], hv[1].numpy(), rtol=1e-8, atol=1e-11)


def test_hvp_through_conv_pool_and_gather_matches_finite_differences() -> None:
    rng = _rng(10)
    g = GraphBuilder("cnn")
    x = g.input("x", F64, (2, 2, 6, 6))
    w = g.input("w", F64, (3, 2, 3, 3))
    t = g.input("t", F64, (5, 3))
    c = g.op("conv2d", x, w, pads=(1, 1, 1, 1), strides=(2, 1))
    h = g.op("max_pool2d", g.op("tanh", c), kernel=(2, 2))
    e = g.op("embedding", t, g.const(np.array([[0, 4], [4, 1]]), "i64"))
    s = g.op("reduce_sum", h * h, axes=None) + g.op("reduce_sum", g.op("sin", e), axes=None)
    g.output(s, "loss")
    graph = g.build()
    hg = hvp(graph, "loss", ["w", "t"])
    feeds = {"x": rng.standard_normal((2, 2, 6, 6)), "w": rng.standard_normal((3, 2, 3, 3)) * 0.5,
             "t": rng.standard_normal((5, 3))}
    tw, tt = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal((5, 3))
    out = evaluate(hg, {**feeds, "tangent_w": tw, "tangent_t": tt})
    gg = grad(graph, "loss", ["w", "t"])
    eps = 1e-5
    plus = evaluate(gg, {**feeds, "w": feeds["w"] + eps * tw, "t": feeds["t"] + eps * tt})
    minus = evaluate(gg, {**feeds, "w": feeds["w"] - eps * tw, "t": feeds["t"] - eps * tt})
    for n in ("w", "t"):
        fd = (plus[f"grad_{n}"] - minus[f"grad_{n}"]) / (2 * eps)
        np.testing.assert_allclose(out[f"hvp_{n}"], fd, rtol=1e-5, atol=1e-6)
    got = Session("cpu", use_cache=False).compile(hg).run({**feeds, "tangent_w": tw, "tangent_t": tt})
    np.testing.assert_allclose(got["hvp_w"], out["hvp_w"], rtol=1e-9, atol=1e-10)


def test_second_order_reverse_over_reverse() -> None:
    g = GraphBuilder("f")
    x = g.input("x", F64, (3,))
    g.output(g.op("reduce_sum", g.op("sin", x) * x * x, axes=None), "loss")
    gg = grad(g.build(), "loss", "x")
    # loss2 = sum(grad_x), built on top of the gradient graph; d loss2 / dx = the Hessian's row sums
    tr = Trace(gg)
    s = tr.b.op("reduce_sum", tr.env["grad_x"], axes=None)
    g2graph = tr.finish([(s, "s")])
    xv = np.array([0.3, -1.1, 2.0])
    g2 = grad(g2graph, "s", "x")
    assert g2.outputs == ("s", "grad_x_1")  # "grad_x" is taken by the first derivative
    h = evaluate(g2, {"x": xv})["grad_x_1"]
    want = 2 * np.sin(xv) + 4 * xv * np.cos(xv) - xv * xv * np.sin(xv)
    np.testing.assert_allclose(h, want, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# vmap


def _vmap_check(graph: Graph, in_axes: dict[str, int | None], feeds: dict[str, np.ndarray], size: int,
                axis_size: Any = None, cpu: bool = True) -> None:
    vg = vmap(graph, in_axes, axis_size=axis_size)
    got = evaluate(vg, feeds)
    for i in range(size):
        one = {k: (np.take(v, i, axis=in_axes[k]) if in_axes.get(k) is not None else v)
               for k, v in feeds.items()}
        want = evaluate(graph, one)
        for o in graph.outputs:
            np.testing.assert_allclose(got[o][i], want[o], rtol=1e-12, atol=1e-12, err_msg=f"{o}[{i}]")
    if cpu:
        out = Session("cpu", use_cache=False).compile(vg).run(feeds)
        for o in graph.outputs:
            np.testing.assert_allclose(out[o], got[o], rtol=1e-10, atol=1e-12)


def _graph(build: Callable[..., Any], **inputs: tuple) -> Graph:
    g = GraphBuilder("f")
    ts = {n: g.input(n, dt, s) for n, (dt, s) in inputs.items()}
    outs = build(g, **ts)
    for k, o in enumerate(outs if isinstance(outs, tuple) else (outs,)):
        g.output(o, f"out{k}")
    return g.build()


VMAP_CASES = [
    ("elementwise-broadcast", lambda g, x, y: x * y + g.op("exp", x), {"x": (F64, (3,)), "y": (F64, (2, 3))},
     {"x": 0, "y": None}),
    ("reductions", lambda g, x, y: (g.op("reduce_sum", x, axes=(-1,)),
                                    g.op("reduce_mean", x, axes=(0,), keepdims=True),
                                    g.op("reduce_max", x, axes=None), g.op("reduce_prod", y, axes=(1,))),
     {"x": (F64, (2, 3)), "y": (F64, (2, 3))}, {"x": 0, "y": 1}),
    ("matmul-cases", lambda g, a, v, m: (a @ m, m @ v, a @ v, g.op("matmul", a, a), m @ m.T),
     {"a": (F64, (3,)), "v": (F64, (3,)), "m": (F64, (3, 3))}, {"a": 0, "v": None, "m": 0}),
    ("matmul-batch-dims", lambda g, a, b: a @ b, {"a": (F64, (2, 3)), "b": (F64, (4, 3, 2))},
     {"a": 0, "b": None}),
    ("reshape-transpose", lambda g, x: (g.op("reshape", x, shape=(-1, 2)), g.op("transpose", x, perm=None),
                                        g.op("transpose", x, perm=(1, 2, 0))),
     {"x": (F64, (2, 3, 2))}, {"x": 0}),
    ("movement", lambda g, x, i: (g.op("slice", x, starts=(1,), stops=(3,), axes=(-1,), steps=(2,)),
                                  g.op("concat", x, g.const(np.ones((2, 1)), F64), axis=1),
                                  g.op("pad", x, pads=(1, 0, 0, 2)), g.op("expand", x, shape=(2, 2, 4)),
                                  g.op("gather", x, i, axis=1), g.op("cumsum", x, axis=0),
                                  g.op("where", x > g.const(0.0, F64), x, g.op("neg", x)),
                                  g.op("cast", x, to="f32")),
     {"x": (F64, (2, 4)), "i": ("i64", (3,))}, {"x": 0, "i": None}),
    ("gather-batched-indices", lambda g, x, i: g.op("gather", x, i, axis=1),
     {"x": (F64, (2, 4)), "i": ("i64", (3,))}, {"x": None, "i": 0}),
    ("gather-both-batched-unrolled", lambda g, x, i: g.op("gather", x, i, axis=0),
     {"x": (F64, (4, 2)), "i": ("i64", (3,))}, {"x": 0, "i": 0}),
    ("scatter_add", lambda g, x, i, u: g.op("scatter_add", x, i, u, axis=0),
     {"x": (F64, (4, 2)), "i": ("i64", (3, 2)), "u": (F64, (3, 2))}, {"x": None, "i": 0, "u": 0}),
    ("hir-norms-softmax", lambda g, x, s: (g.op("softmax", x, axis=0), g.op("log_softmax", x),
                                           g.op("layer_norm", x, s, s), g.op("rms_norm", x, s),
                                           g.op("linear", x, g.const(np.ones((2, 3)), F64),
                                                g.const(np.ones(2), F64)),
                                           g.op("gelu", x)),
     {"x": (F64, (2, 3)), "s": (F64, (3,))}, {"x": 0, "s": None}),
    ("hir-layer_norm-batched-gamma", lambda g, x, s: g.op("layer_norm", x, s, s),
     {"x": (F64, (2, 3)), "s": (F64, (3,))}, {"x": 0, "s": 0}),
    ("conv2d-x", lambda g, x, w: g.op("conv2d", x, w, strides=(2, 1), pads=(1, 1, 0, 0)),
     {"x": (F64, (2, 2, 5, 4)), "w": (F64, (3, 2, 2, 2))}, {"x": 0, "w": None}),
    ("conv2d-x-and-w", lambda g, x, w: g.op("conv2d", x, w, groups=2),
     {"x": (F64, (2, 4, 4, 4)), "w": (F64, (2, 2, 3, 3))}, {"x": 0, "w": 0}),
    ("attention", lambda g, q, k, v: (g.op("attention", q, k, v, mask="causal"), g.op("attention", q, k, v)),
     {"q": (F64, (2, 3, 4)), "k": (F64, (2, 3, 4)), "v": (F64, (2, 3, 4))}, {"q": 0, "k": None, "v": 0}),
    ("pools-via-decomposition", lambda g, x: (g.op("max_pool2d", x, kernel=(2, 2)),
                                              g.op("avg_pool2d", x, kernel=(2, 2), pads=(1, 1, 0, 0))),
     {"x": (F64, (1, 2, 4, 4))}, {"x": 0}),
    ("in-axis-1", lambda g, x, y: g.op("softmax", x @ y, axis=-1), {"x": (F64, (2, 3)), "y": (F64, (3, 2))},
     {"x": 1, "y": None}),
    ("embedding-ids", lambda g, t, i: g.op("embedding", t, i), {"t": (F64, (2, 3)), "i": ("i64", (2, 2))},
     {"t": None, "i": 0}),
    ("embedding-table", lambda g, t, i: g.op("embedding", t, i), {"t": (F64, (2, 3)), "i": ("i64", (2, 2))},
     {"t": 0, "i": None}),
    ("conv2d_bias", lambda g, x, w, c: g.op("conv2d_bias", x, w, c, pads=(1, 0, 1, 0)),
     {"x": (F64, (2, 2, 4, 3)), "w": (F64, (3, 2, 2, 2)), "c": (F64, (3,))}, {"x": 0, "w": None, "c": None}),
    ("attention-batched-bias", lambda g, q, k, v, m: g.op("attention", q, k, v, m, mask="bias"),
     {"q": (F64, (2, 3, 4)), "k": (F64, (2, 3, 4)), "v": (F64, (2, 3, 4)), "m": (F64, (3, 3))},
     {"q": 0, "k": None, "v": None, "m": 0}),
    ("attention-padding", lambda g, q, k, v, m: g.op("attention", q, k, v, m, mask="padding"),
     {"q": (F64, (2, 3, 4)), "k": (F64, (2, 3, 4)), "v": (F64, (2, 3, 4)), "m": ("i64", (2, 3))},
     {"q": 0, "k": 0, "v": None, "m": None}),
]


@pytest.mark.parametrize("case", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
def test_vmap(case: tuple) -> None:
    _, build, inputs, axes = case
    graph = _graph(build, **inputs)
    size = 3
    rng = _rng(11)
    feeds = {}
    for n, (dt, shape) in inputs.items():
        a = axes.get(n)
        full = list(shape)
        if a is not None:
            full.insert(a, size)
        if dt == "i64":
            feeds[n] = rng.integers(0, 2, full)
        else:
            feeds[n] = rng.standard_normal(full)
    static = "unrolled" in case[0] or "conv2d" in case[0]
    _vmap_check(graph, axes, feeds, size, axis_size=size if static else None)


def test_vmap_unbatched_outputs_are_broadcast() -> None:
    graph = _graph(lambda g, x, y: (x * 2.0, g.op("exp", y), y), x=(F64, (2,)), y=(F64, (3,)))
    vg = vmap(graph, {"x": 0}, axis_size=4)
    assert vg.outputs == ("out0", "out1", "out2")
    xv, yv = _rng(14).standard_normal((4, 2)), _rng(15).standard_normal(3)
    out = Session("cpu", use_cache=False).compile(vg).run(x=xv, y=yv)
    np.testing.assert_allclose(out["out0"], xv * 2)
    np.testing.assert_allclose(out["out1"], np.broadcast_to(np.exp(yv), (4, 3)))
    np.testing.assert_allclose(out["out2"], np.broadcast_to(yv, (4, 3)))


def test_vmap_symbolic_and_static_sizes() -> None:
    graph = _graph(lambda g, x: g.op("softmax", x, axis=0), x=(F64, (3,)))
    sym = vmap(graph, 0)
    assert sym.inputs[0].type.shape == ("vmap", 3)
    st = vmap(graph, {"x": 0}, axis_size=4)
    assert st.inputs[0].type.shape == (4, 3)
    with pytest.raises(IRError, match="no input is batched"):
        vmap(graph, None)


def test_per_example_gradients_with_vmap_of_grad() -> None:
    graph = _mlp(batch=2)
    gg = grad(graph, "loss", ["w1", "w2"])
    vg = vmap(gg, {"x": 0, "y": 0})
    rng = _rng(12)
    x, y = rng.standard_normal((4, 2, 4)), rng.integers(0, 3, (4, 2))
    out = Session("cpu", use_cache=False).compile(vg).run(x=x, y=y)
    for i in range(4):
        want = evaluate(gg, {"x": x[i], "y": y[i]})
        for k in ("loss", "grad_w1", "grad_w2"):
            np.testing.assert_allclose(out[k][i], want[k], rtol=1e-10, atol=1e-12)


def test_grad_of_vmap() -> None:
    g = GraphBuilder("f")
    x = g.input("x", F64, (3,))
    w = g.param("w", np.array([[1.0, 2.0], [0.5, -1.0], [0.3, 0.1]]))
    g.output(g.op("tanh", x @ w), "y")
    vg = vmap(g.build(), 0, axis_size=4)
    tr = Trace(vg)  # loss = sum over the batch, built on top of the vmapped graph
    loss = tr.b.op("reduce_sum", tr.env["y"], axes=None)
    lg = tr.finish([(loss, "loss")])
    xv = _rng(13).standard_normal((4, 3))
    got = evaluate(grad(lg, "loss", "w"), {"x": xv})["grad_w"]
    t = np.tanh(xv @ np.array(vg.weights["w"]))
    np.testing.assert_allclose(got, xv.T @ (1 - t * t), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Plugin ops bring their own rules


def test_plugin_op_with_only_a_vjp_rule_gets_grad_jvp_and_hvp() -> None:
    name = "autodiff_test.cube"

    def infer(ts: Any, attrs: Any) -> list:
        return [ts[0]]

    schema = OpSchema(name, ("x",), infer, lambda xs, a: [xs[0] ** 3], provider="tests", elementwise=True)
    REGISTRY.register(schema)
    try:
        g = GraphBuilder("p")
        x = g.input("x", F64, (3,))
        g.output(g.op("reduce_sum", g.op(name, x) * g.op("sin", x), axes=None), "loss")
        graph = g.build()
        with pytest.raises(IRError, match="register_vjp"):
            grad(graph, "loss", "x")

        @register_vjp(name)
        def cube_vjp(b: Any, ins: Any, outs: Any, cts: Any, attrs: Any) -> list:
            return [cts[0] * b.const(3.0, ins[0].dtype) * ins[0] * ins[0]]

        with pytest.raises(IRError, match="already has a vjp rule"):
            register_vjp(name, lambda *a: None)
        xv = np.array([0.4, -0.9, 1.3])
        gx = evaluate(grad(graph, "loss", "x"), {"x": xv})["grad_x"]
        want_g = 3 * xv ** 2 * np.sin(xv) + xv ** 3 * np.cos(xv)
        np.testing.assert_allclose(gx, want_g, rtol=1e-12)
        t = np.array([1.0, -2.0, 0.5])
        jt = evaluate(jvp(graph, "x"), {"x": xv, "tangent_x": t})["tangent_loss"]
        np.testing.assert_allclose(jt, want_g @ t, rtol=1e-12)
        h = evaluate(hvp(graph, "loss", "x"), {"x": xv, "tangent_x": t})["hvp_x"]
        want_h = (6 * xv * np.sin(xv) + 6 * xv ** 2 * np.cos(xv) - xv ** 3 * np.sin(xv)) * t
        np.testing.assert_allclose(h, want_h, rtol=1e-12)

        @register_vjp(name, replace=True)
        def bad_vjp(b: Any, ins: Any, outs: Any, cts: Any, attrs: Any) -> list:
            return [b.op("reduce_sum", cts[0], axes=None)]

        with pytest.raises(IRError, match="returned f64"):
            grad(graph, "loss", "x")
    finally:
        REGISTRY.unregister(name)
        VJP_RULES.pop(name, None)
