"""HIR ops: reference vs an independent oracle, decomposition vs reference, inference errors."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import scipy.special

from rlx_core.dtypes import DType
from rlx_core.errors import DTypeError, InputError, IRError, ShapeError
from rlx_core.ir import REGISTRY, Graph, GraphBuilder, Tensor
from rlx_core.ir.hir import HIR_OPS, masked_score
from rlx_core.ir.reference import evaluate

Arrays = Sequence[np.ndarray]
Oracle = Callable[[Arrays, Mapping[str, Any]], np.ndarray]


@dataclass(frozen=True)
class In:
    """One operand: ``kind`` picks the generator and (for masks/ids) the dtype."""

    name: str
    shape: tuple[Any, ...]
    kind: str = "float"  # float | pos | ids | ids32 | keep_bool | keep_float | keep_int
    high: int = 0


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    ins: tuple[In, ...]
    oracle: Oracle
    attrs: Mapping[str, Any] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("f32", "f64")


# -- data --------------------------------------------------------------------------------------

def _in_dtype(spec: In, dtype: str) -> str:
    return {"ids": "i64", "ids32": "i32", "keep_bool": "bool", "keep_int": "i64"}.get(spec.kind, dtype)


def _make(spec: In, dtype: str, rng: np.random.Generator) -> np.ndarray:
    dt = DType.parse(_in_dtype(spec, dtype)).np
    if spec.kind == "float":
        return rng.standard_normal(spec.shape).astype(dt)
    if spec.kind == "pos":
        return rng.uniform(0.5, 2.0, spec.shape).astype(dt)
    if spec.kind in ("ids", "ids32"):
        return rng.integers(0, spec.high, spec.shape).astype(dt)
    keep = rng.random(spec.shape) > 0.4
    keep[0, 0] = True  # the first row always sees something ...
    keep[-1, :] = False  # ... and the last is fully masked, which must give uniform weights, not NaN
    return keep.astype(dt)


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a


# -- independent oracles -----------------------------------------------------------------------

def o_linear(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x, w, b = xs
    return np.einsum("...i,oi->...o", x, w) + b


def o_attention(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    kind = a.get("mask", "none")
    q, k, v = xs[:3]
    three = q.ndim == 3
    if three:
        q, k, v = q[:, None], k[:, None], v[:, None]
    nb, nh, sq, d = q.shape
    sk = k.shape[2]
    scale = a.get("scale") or 1.0 / math.sqrt(d)
    bias = np.zeros((nb, nh, sq, sk))
    if kind == "bias":
        bias = (np.broadcast_to(xs[3], (nb, sq, sk))[:, None] if three
                else np.broadcast_to(xs[3], (nb, nh, sq, sk)))
    out = np.zeros((nb, nh, sq, v.shape[-1]))
    for b in range(nb):
        for h in range(nh):
            for i in range(sq):
                vis = []
                for j in range(sk):
                    if kind == "causal":
                        ok = j <= i
                    elif kind == "sliding_window":
                        ok = i - a["window"] < j <= i
                    elif kind == "padding":
                        ok = bool(xs[3][b, j] != 0)
                    else:
                        ok = True
                    if ok:
                        vis.append(j)
                if not vis:
                    out[b, h, i] = v[b, h].mean(axis=0)
                    continue
                s = np.array([float(q[b, h, i] @ k[b, h, j]) * scale + bias[b, h, i, j] for j in vis])
                p = np.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ v[b, h, vis]
    return out[:, 0] if three else out


def _flat_trailing(x: np.ndarray, axis: int) -> tuple[np.ndarray, int]:
    ax = axis % x.ndim
    n = math.prod(x.shape[ax:])
    return x.reshape(-1, n), n


def o_layer_norm(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x, gamma, beta = xs
    x2, n = _flat_trailing(x, a.get("axis", -1))
    mu = x2.sum(axis=1, keepdims=True) / n
    var = ((x2 - mu) ** 2).sum(axis=1, keepdims=True) / n
    y = ((x2 - mu) / np.sqrt(var + a.get("eps", 1e-5))).reshape(x.shape)
    return y * gamma + beta


def o_rms_norm(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x, gamma = xs
    x2, n = _flat_trailing(x, a.get("axis", -1))
    rms = np.sqrt((x2 ** 2).sum(axis=1, keepdims=True) / n + a.get("eps", 1e-6))
    return (x2 / rms).reshape(x.shape) * gamma


def o_batch_norm(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x, scale, bias, mean, var = xs
    out = np.empty_like(x)
    for c in range(x.shape[1]):
        out[:, c] = (x[:, c] - mean[c]) / math.sqrt(var[c] + a.get("eps", 1e-5)) * scale[c] + bias[c]
    return out


def o_gelu(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x = xs[0]
    if a.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2)))


def o_silu(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    return xs[0] * scipy.special.expit(xs[0])


def o_relu(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    return np.where(xs[0] > 0, xs[0], 0.0)


def o_softmax(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    return scipy.special.softmax(xs[0], axis=a.get("axis", -1))


def o_log_softmax(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    return scipy.special.log_softmax(xs[0], axis=a.get("axis", -1))


def o_conv2d_bias(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    x, w, b = xs
    sh, sw = a.get("strides", (1, 1))
    pt, pl, pb, pr = a.get("pads", (0, 0, 0, 0))
    dh, dw = a.get("dilations", (1, 1))
    groups = a.get("groups", 1)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, _, h, wd = xp.shape
    o, cg, kh, kw = w.shape
    ho = (h - dh * (kh - 1) - 1) // sh + 1
    wo = (wd - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.empty((n, o, ho, wo))
    for ni in range(n):
        for oi in range(o):
            gi = oi // og
            for i in range(ho):
                for j in range(wo):
                    patch = xp[ni, gi * cg:(gi + 1) * cg,
                               i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
                    out[ni, oi, i, j] = float((patch * w[oi]).sum()) + b[oi]
    return out


def _pool_oracle(mode: str) -> Oracle:
    def oracle(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
        x = xs[0]
        kh, kw = a["kernel"]
        sh, sw = a.get("strides") or (kh, kw)
        pt, pl, pb, pr = a.get("pads", (0, 0, 0, 0))
        n, c, h, w = x.shape
        ho = (h + pt + pb - kh) // sh + 1
        wo = (w + pl + pr - kw) // sw + 1
        out = np.empty((n, c, ho, wo))
        for i in range(ho):
            for j in range(wo):
                r0, c0 = i * sh - pt, j * sw - pl
                rows = [r for r in range(r0, r0 + kh) if 0 <= r < h]
                cols = [q for q in range(c0, c0 + kw) if 0 <= q < w]
                win = x[:, :, rows][:, :, :, cols]
                if mode == "max":
                    out[:, :, i, j] = win.max(axis=(2, 3))
                else:
                    div = kh * kw if a.get("count_include_pad", True) else len(rows) * len(cols)
                    out[:, :, i, j] = win.sum(axis=(2, 3)) / div
        return out
    return oracle


def o_embedding(xs: Arrays, a: Mapping[str, Any]) -> np.ndarray:
    table, ids = xs
    rows = [table[int(i)] for i in ids.ravel()]
    return np.stack(rows).reshape((*ids.shape, table.shape[1]))


# -- cases -------------------------------------------------------------------------------------

def _att(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...] | None = None,
         extra: In | None = None) -> tuple[In, ...]:
    ins = (In("q", q), In("k", k), In("v", v or k))
    return (*ins, extra) if extra else ins


ALL = ("f32", "f64")
WITH_F16 = ("f16", "f32", "f64")

CASES: list[Case] = [
    Case("linear", "linear", (In("x", (2, 3, 5)), In("w", (4, 5)), In("b", (4,))), o_linear),
    Case("linear_vec", "linear", (In("x", (5,)), In("w", (3, 5)), In("b", (3,))), o_linear),
    Case("att_none", "attention", _att((2, 2, 3, 4), (2, 2, 5, 4)), o_attention, {}, WITH_F16),
    Case("att_none_rank3_scale_dv", "attention", _att((2, 3, 4), (2, 5, 4), (2, 5, 6)), o_attention,
         {"scale": 0.5}),
    Case("att_causal", "attention", _att((2, 2, 4, 4), (2, 2, 4, 4)), o_attention,
         {"mask": "causal"}, WITH_F16),
    Case("att_causal_rect", "attention", _att((1, 2, 3, 4), (1, 2, 5, 4)), o_attention,
         {"mask": "causal"}),
    Case("att_causal_rank3", "attention", _att((2, 4, 4), (2, 4, 4)), o_attention, {"mask": "causal"}),
    Case("att_sliding", "attention", _att((2, 2, 5, 4), (2, 2, 5, 4)), o_attention,
         {"mask": "sliding_window", "window": 2}),
    Case("att_sliding_rank3", "attention", _att((1, 6, 3), (1, 6, 3)), o_attention,
         {"mask": "sliding_window", "window": 3}),
    Case("att_bias_full", "attention", _att((2, 2, 3, 4), (2, 2, 5, 4), extra=In("bias", (2, 2, 3, 5))),
         o_attention, {"mask": "bias"}),
    Case("att_bias_bcast", "attention", _att((2, 2, 3, 4), (2, 2, 5, 4), extra=In("bias", (3, 5))),
         o_attention, {"mask": "bias"}),
    Case("att_bias_rank3", "attention", _att((2, 3, 4), (2, 5, 4), extra=In("bias", (2, 1, 5))),
         o_attention, {"mask": "bias"}),
    Case("att_pad_bool", "attention", _att((3, 2, 3, 4), (3, 2, 5, 4), extra=In("m", (3, 5), "keep_bool")),
         o_attention, {"mask": "padding"}, WITH_F16),
    Case("att_pad_float_rank3", "attention", _att((2, 3, 4), (2, 5, 4), extra=In("m", (2, 5), "keep_float")),
         o_attention, {"mask": "padding"}),
    Case("att_pad_int", "attention", _att((2, 1, 2, 4), (2, 1, 6, 4), extra=In("m", (2, 6), "keep_int")),
         o_attention, {"mask": "padding", "scale": 0.3}),
    Case("layer_norm", "layer_norm", (In("x", (2, 3, 8)), In("g", (8,)), In("b", (8,))), o_layer_norm,
         {}, WITH_F16),
    Case("layer_norm_axis1", "layer_norm", (In("x", (2, 3, 8)), In("g", (3, 8)), In("b", (3, 8))),
         o_layer_norm, {"axis": 1, "eps": 1e-3}),
    Case("rms_norm", "rms_norm", (In("x", (2, 3, 8)), In("g", (8,))), o_rms_norm),
    Case("rms_norm_axis", "rms_norm", (In("x", (2, 3, 8)), In("g", (3, 8))), o_rms_norm,
         {"axis": -2, "eps": 1e-4}),
    Case("batch_norm", "batch_norm",
         (In("x", (2, 3, 4, 5)), In("s", (3,)), In("b", (3,)), In("m", (3,)), In("v", (3,), "pos")),
         o_batch_norm),
    Case("batch_norm_rank2", "batch_norm",
         (In("x", (4, 3)), In("s", (3,)), In("b", (3,)), In("m", (3,)), In("v", (3,), "pos")),
         o_batch_norm, {"eps": 1e-3}),
    Case("gelu", "gelu", (In("x", (3, 7)),), o_gelu, {}, WITH_F16),
    Case("gelu_tanh", "gelu", (In("x", (3, 7)),), o_gelu, {"approximate": "tanh"}, WITH_F16),
    Case("silu", "silu", (In("x", (3, 7)),), o_silu),
    Case("relu", "relu", (In("x", (3, 7)),), o_relu),
    Case("softmax", "softmax", (In("x", (3, 7)),), o_softmax, {}, WITH_F16),
    Case("softmax_axis0", "softmax", (In("x", (3, 4, 2)),), o_softmax, {"axis": 0}),
    Case("log_softmax", "log_softmax", (In("x", (3, 7)),), o_log_softmax),
    Case("log_softmax_axis1", "log_softmax", (In("x", (3, 4, 2)),), o_log_softmax, {"axis": 1}),
    Case("conv2d_bias", "conv2d_bias", (In("x", (2, 3, 5, 5)), In("w", (4, 3, 3, 3)), In("b", (4,))),
         o_conv2d_bias),
    Case("conv2d_bias_strided", "conv2d_bias",
         (In("x", (1, 2, 7, 6)), In("w", (3, 2, 2, 3)), In("b", (3,))), o_conv2d_bias,
         {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (2, 1)}),
    Case("conv2d_bias_groups", "conv2d_bias",
         (In("x", (2, 4, 5, 5)), In("w", (6, 2, 3, 3)), In("b", (6,))), o_conv2d_bias,
         {"groups": 2, "pads": (1, 1, 1, 1)}),
    Case("max_pool", "max_pool2d", (In("x", (2, 3, 6, 6)),), _pool_oracle("max"), {"kernel": (2, 2)}),
    Case("max_pool_padded", "max_pool2d", (In("x", (1, 2, 7, 5)),), _pool_oracle("max"),
         {"kernel": (3, 3), "strides": (2, 1), "pads": (1, 1, 1, 0)}),
    Case("avg_pool", "avg_pool2d", (In("x", (2, 3, 6, 6)),), _pool_oracle("avg"), {"kernel": (2, 2)}),
    Case("avg_pool_incl", "avg_pool2d", (In("x", (1, 2, 7, 5)),), _pool_oracle("avg"),
         {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    Case("avg_pool_excl", "avg_pool2d", (In("x", (1, 2, 7, 5)),), _pool_oracle("avg"),
         {"kernel": (3, 2), "strides": (2, 1), "pads": (2, 1, 1, 0), "count_include_pad": False}),
    Case("embedding", "embedding", (In("t", (10, 4)), In("ids", (2, 3), "ids", 10)), o_embedding),
    Case("embedding_i32", "embedding", (In("t", (7, 3)), In("ids", (5,), "ids32", 7)), o_embedding),
]

# Storage rounding of the one HIR output, vs rounding of every intermediate of the decomposition.
REF_TOL = {"f64": 1e-10, "f32": 2e-6, "f16": 1.5e-3, "bf16": 1e-2}
DEC_TOL = {"f64": 1e-8, "f32": 1e-4, "f16": 2e-2, "bf16": 8e-2}


def _build(case: Case, dtype: str) -> tuple[Graph, Graph, dict[str, np.ndarray]]:
    """The HIR graph, its decomposition into MIR, and deterministic inputs."""
    rng = np.random.default_rng(zlib.crc32(f"{case.id}-{dtype}".encode()))
    data = {s.name: _make(s, dtype, rng) for s in case.ins}

    g = GraphBuilder(f"hir_{case.id}")
    ins = [g.input(s.name, _in_dtype(s, dtype), s.shape) for s in case.ins]
    y = g.op(case.op, *ins, **case.attrs)
    g.output(y)
    hir = g.build()

    node = next(n for n in hir.nodes if n.op == case.op)
    d = GraphBuilder(f"dec_{case.id}")
    dins = [d.input(s.name, _in_dtype(s, dtype), s.shape) for s in case.ins]
    outs = REGISTRY.get(case.op).decompose(d, dins, node.attrs)
    assert isinstance(outs, list) and len(outs) == 1 and isinstance(outs[0], Tensor)
    assert outs[0].type == hir.types[y.name], "decomposition must produce the HIR node's type"
    d.output(outs[0])
    return hir, d.build(), data


PARAMS = [pytest.param(c, dt, id=f"{c.id}-{dt}") for c in CASES for dt in c.dtypes]


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_reference_matches_oracle(case: Case, dtype: str) -> None:
    hir, _, data = _build(case, dtype)
    ref = evaluate(hir, data)[hir.outputs[0]]
    want = case.oracle([_f64(data[s.name]) for s in case.ins], case.attrs)
    assert ref.dtype == np.float64
    assert ref.shape == want.shape
    tol = REF_TOL[dtype]
    np.testing.assert_allclose(ref, want, rtol=tol, atol=tol)


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_decomposition_matches_reference(case: Case, dtype: str) -> None:
    hir, dec, data = _build(case, dtype)
    ref = evaluate(hir, data)[hir.outputs[0]]
    got = evaluate(dec, data)[dec.outputs[0]]
    assert np.all(np.isfinite(got))
    tol = DEC_TOL[dtype]
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_every_hir_op_is_covered_and_registered() -> None:
    assert set(HIR_OPS) == {c.op for c in CASES}
    for name in HIR_OPS:
        schema = REGISTRY.get(name)
        assert schema.level == "hir"
        assert schema.decompose is not None
        assert schema.doc
        assert set(schema.dtypes) >= {DType.F16, DType.BF16, DType.F32, DType.F64}
    assert set(REGISTRY.get("embedding").dtypes) >= {DType.I32, DType.I64}


@pytest.mark.parametrize("op", HIR_OPS)
def test_decomposition_emits_only_mir(op: str) -> None:
    for case in (c for c in CASES if c.op == op):
        _, dec, _ = _build(case, "f32")
        assert dec.nodes
        for node in dec.nodes:
            assert REGISTRY.get(node.op).level == "mir", f"{op} decomposes into HIR op {node.op}"


def test_decompose_fills_default_attrs() -> None:
    g = GraphBuilder()
    x = g.input("x", "f32", (2, 5))
    (y,) = REGISTRY.get("softmax").decompose(g, [x], {})
    g.output(y)
    data = {"x": np.arange(10, dtype=np.float32).reshape(2, 5)}
    got = evaluate(g.build(), data)[y.name]
    np.testing.assert_allclose(got, scipy.special.softmax(data["x"].astype(np.float64), -1), rtol=1e-6)


# -- numerics ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_softmax_decomposition_is_stable_for_large_logits(op: str, dtype: str) -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 60.0]]).astype(DType.parse(dtype).np)
    g = GraphBuilder()
    xi = g.input("x", dtype, x.shape)
    (y,) = REGISTRY.get(op).decompose(g, [xi], {})
    g.output(y)
    got = evaluate(g.build(), {"x": x})[y.name]
    want = getattr(scipy.special, op)(x.astype(np.float64), axis=-1)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_layer_norm_decomposition_is_stable_with_large_offset() -> None:
    # E[x^2] - E[x]^2 would lose every digit here in f32; centring first keeps them.
    rng = np.random.default_rng(7)
    x = (1e4 + rng.standard_normal((3, 64))).astype(np.float32)
    case = next(c for c in CASES if c.id == "layer_norm")
    g = GraphBuilder()
    ins = [g.input("x", "f32", x.shape), g.input("g", "f32", (64,)), g.input("b", "f32", (64,))]
    (y,) = REGISTRY.get("layer_norm").decompose(g, ins, {})
    g.output(y)
    data = {"x": x, "g": np.ones(64, np.float32), "b": np.zeros(64, np.float32)}
    got = evaluate(g.build(), data)[y.name]
    want = case.oracle([_f64(data[k]) for k in ("x", "g", "b")], {})
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_fully_masked_rows_are_uniform_not_nan(dtype: str) -> None:
    rng = np.random.default_rng(3)
    npdt = DType.parse(dtype).np
    q, k, v = (rng.standard_normal((2, 1, 3, 4)).astype(npdt) for _ in range(3))
    mask = np.array([[True, False, True], [False, False, False]])
    g = GraphBuilder()
    ins = [g.input("q", dtype, q.shape), g.input("k", dtype, k.shape), g.input("v", dtype, v.shape),
           g.input("m", "bool", mask.shape)]
    y = g.op("attention", *ins, mask="padding")
    g.output(y)
    hir = g.build()
    data = {"q": q, "k": k, "v": v, "m": mask}
    ref = evaluate(hir, data)[y.name]

    d = GraphBuilder()
    dins = [d.input(n, t.type.dtype, t.shape) for n, t in zip("qkvm", ins)]
    (out,) = REGISTRY.get("attention").decompose(d, dins, hir.nodes[0].attrs)
    d.output(out)
    got = evaluate(d.build(), data)[out.name]

    uniform = np.broadcast_to(v[1].astype(np.float64).mean(axis=-2, keepdims=True), ref[1].shape)
    tol = DEC_TOL[dtype]
    for arr in (ref, got):
        assert np.all(np.isfinite(arr))
        np.testing.assert_allclose(arr[1], uniform, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_masked_score_is_finite_in_every_float_dtype() -> None:
    for dt in (DType.F16, DType.BF16, DType.F32, DType.F64):
        m = np.asarray(masked_score(dt)).astype(dt.np)
        assert np.isfinite(m.astype(np.float64)) and m.astype(np.float64) < -1e4
        # Subtracting a moderate row max must not overflow to -inf either.
        assert np.isfinite((m - np.asarray(100, dt.np)).astype(np.float64))


def test_symbolic_attention_decomposes_then_specializes() -> None:
    rng = np.random.default_rng(11)
    g = GraphBuilder()
    shape = ("batch", 2, "seq", 4)
    ins = [g.input(n, "f32", shape) for n in "qkv"] + [g.input("m", "bool", ("batch", "seq"))]
    y = g.op("attention", *ins, mask="padding")
    g.output(y)
    hir = g.build()
    for kind, extra in (("causal", []), ("sliding_window", []), ("padding", [3])):
        d = GraphBuilder()
        dins = [d.input(n, "f32", shape) for n in "qkv"]
        if extra:
            dins.append(d.input("m", "bool", ("batch", "seq")))
        attrs = {"mask": kind, "window": 2} if kind == "sliding_window" else {"mask": kind}
        (out,) = REGISTRY.get("attention").decompose(d, dins, attrs)
        assert out.shape == shape
        d.output(out)
        dec = d.build().specialize({"batch": 2, "seq": 5})
        data = {n: rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for n in "qkv"}
        if extra:
            data["m"] = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], bool)
        got = evaluate(dec, data)[dec.outputs[0]]
        want = o_attention([_f64(data[n]) for n in ("q", "k", "v", "m")[:len(dins)]], attrs)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert hir.types[y.name].shape == shape


def test_flops() -> None:
    g = GraphBuilder()
    x = g.input("x", "f32", (8, 16))
    w = g.input("w", "f32", (32, 16))
    b = g.input("b", "f32", (32,))
    y = g.op("linear", x, w, b)
    lin = REGISTRY.get("linear")
    assert lin.flops([x.type, w.type, b.type], [y.type], {}) == pytest.approx(8 * 32 * (2 * 16 + 1))
    q = g.input("q", "f32", (2, 4, 8, 16))
    kv = g.input("kv", "f32", (2, 4, 10, 16))
    a = g.op("attention", q, kv, kv)
    att = REGISTRY.get("attention")
    fl = att.flops([q.type, kv.type, kv.type], [a.type], {})
    assert fl >= 2 * 2 * (2 * 4 * 8 * 10 * 16)


# -- inference errors --------------------------------------------------------------------------

def _try(op: str, specs: Sequence[tuple[str, tuple[Any, ...]]], **attrs: Any) -> None:
    g = GraphBuilder("bad")
    ins = [g.input(f"i{i}", dt, shape) for i, (dt, shape) in enumerate(specs)]
    g.op(op, *ins, **attrs)


Q = ("f32", (2, 2, 3, 4))
K = ("f32", (2, 2, 5, 4))

BAD: list[Any] = [
    pytest.param(IRError, "attention", [Q, K, K], {"mask": "bias"}, id="bias-missing-input"),
    pytest.param(IRError, "attention", [Q, K, K, ("bool", (2, 5))], {}, id="none-extra-input"),
    pytest.param(IRError, "attention", [Q, K, K, ("bool", (2, 5))], {"mask": "causal"},
                 id="causal-extra-input"),
    pytest.param(IRError, "attention", [Q, K, K], {"mask": "sliding_window"}, id="sliding-no-window"),
    pytest.param(IRError, "attention", [Q, K, K], {"mask": "sliding_window", "window": 0},
                 id="sliding-window-0"),
    pytest.param(IRError, "attention", [Q, K, K], {"window": 3}, id="window-without-sliding"),
    pytest.param(IRError, "attention", [Q, K, K], {"mask": "alibi"}, id="unknown-mask-kind"),
    pytest.param(ShapeError, "attention", [Q, K, K, ("bool", (2, 3))], {"mask": "padding"},
                 id="padding-shape"),
    pytest.param(DTypeError, "attention", [Q, K, K, ("c64", (2, 5))], {"mask": "padding"},
                 id="padding-dtype"),
    pytest.param(ShapeError, "attention", [Q, K, K, ("f32", (4, 5))], {"mask": "bias"}, id="bias-shape"),
    pytest.param(DTypeError, "attention", [Q, K, K, ("f16", (3, 5))], {"mask": "bias"}, id="bias-dtype"),
    pytest.param(ShapeError, "attention", [Q, ("f32", (2, 2, 5, 3)), K], {}, id="qk-head-dim"),
    pytest.param(ShapeError, "attention", [Q, K, ("f32", (2, 2, 4, 4))], {}, id="kv-seq"),
    pytest.param(ShapeError, "attention", [Q, ("f32", (2, 3, 5, 4)), ("f32", (2, 3, 5, 4))], {},
                 id="heads"),
    pytest.param(ShapeError, "attention", [("f32", (3, 4)), ("f32", (5, 4)), ("f32", (5, 4))], {},
                 id="rank2"),
    pytest.param(ShapeError, "attention", [("f32", (2, 3, "d")), ("f32", (2, 5, "d")), ("f32", (2, 5, "d"))],
                 {}, id="symbolic-d-needs-scale"),
    pytest.param(DTypeError, "attention", [Q, ("f16", (2, 2, 5, 4)), K], {}, id="mixed-dtypes"),
    pytest.param(DTypeError, "attention", [("i32", (2, 3, 4))] * 3, {}, id="int-attention"),
    pytest.param(ShapeError, "linear", [("f32", (2, 5)), ("f32", (5, 4)), ("f32", (4,))], {},
                 id="linear-w-transposed"),
    pytest.param(ShapeError, "linear", [("f32", (2, 5)), ("f32", (4, 5)), ("f32", (5,))], {},
                 id="linear-bias"),
    pytest.param(ShapeError, "linear", [("f32", (2, 5)), ("f32", (4, 5, 1)), ("f32", (4,))], {},
                 id="linear-w-rank"),
    pytest.param(ShapeError, "layer_norm", [("f32", (2, 8)), ("f32", (7,)), ("f32", (8,))], {},
                 id="layer-norm-gamma"),
    pytest.param(ShapeError, "layer_norm", [("f32", (2, 8)), ("f32", (8,)), ("f32", (8,))], {"axis": 0},
                 id="layer-norm-axis-vs-gamma"),
    pytest.param(ShapeError, "layer_norm", [("f32", (2, 8)), ("f32", (8,)), ("f32", (8,))], {"axis": 2},
                 id="layer-norm-axis-range"),
    pytest.param(DTypeError, "layer_norm", [("f32", (2, 8)), ("f16", (8,)), ("f32", (8,))], {},
                 id="layer-norm-dtype"),
    pytest.param(DTypeError, "rms_norm", [("i32", (2, 8)), ("i32", (8,))], {}, id="rms-norm-int"),
    pytest.param(ShapeError, "rms_norm", [("f32", (2, 8)), ("f32", (2, 8))], {}, id="rms-norm-gamma"),
    pytest.param(ShapeError, "batch_norm", [("f32", (2, 3, 4))] + [("f32", (4,))] * 4, {},
                 id="batch-norm-channels"),
    pytest.param(ShapeError, "batch_norm", [("f32", (3,))] * 5, {}, id="batch-norm-rank1"),
    pytest.param(IRError, "gelu", [("f32", (3,))], {"approximate": "sigmoid"}, id="gelu-mode"),
    pytest.param(DTypeError, "silu", [("i64", (3,))], {}, id="silu-int"),
    pytest.param(DTypeError, "relu", [("bool", (3,))], {}, id="relu-bool"),
    pytest.param(ShapeError, "softmax", [("f32", (3, 4))], {"axis": 2}, id="softmax-axis"),
    pytest.param(ShapeError, "log_softmax", [("f32", ())], {}, id="log-softmax-scalar"),
    pytest.param(ShapeError, "conv2d_bias", [("f32", (1, 3, 5, 5)), ("f32", (4, 3, 3, 3)), ("f32", (3,))],
                 {}, id="conv-bias-shape"),
    pytest.param(ShapeError, "conv2d_bias", [("f32", (1, 3, 5, 5)), ("f32", (4, 2, 3, 3)), ("f32", (4,))],
                 {}, id="conv-channels"),
    pytest.param(ShapeError, "max_pool2d", [("f32", (1, 3, 5))], {"kernel": (2, 2)}, id="pool-rank"),
    pytest.param(ShapeError, "max_pool2d", [("f32", (1, 3, 5, 5))], {"kernel": (2, 2), "pads": (2, 0, 0, 0)},
                 id="pool-pad-ge-kernel"),
    pytest.param(ShapeError, "avg_pool2d", [("f32", (1, 3, 5, 5))], {"kernel": (2,)}, id="pool-kernel-len"),
    pytest.param(ShapeError, "avg_pool2d", [("f32", (1, 3, 2, 2))], {"kernel": (3, 3)}, id="pool-too-big"),
    pytest.param(ShapeError, "avg_pool2d", [("f32", (1, 3, "h", 4))], {"kernel": (2, 2)},
                 id="pool-symbolic"),
    pytest.param(IRError, "avg_pool2d", [("f32", (1, 3, 4, 4))], {}, id="pool-needs-kernel"),
    pytest.param(DTypeError, "embedding", [("f32", (10, 4)), ("f32", (3,))], {}, id="embedding-float-ids"),
    pytest.param(DTypeError, "embedding", [("i64", (10, 4)), ("i64", (3,))], {}, id="embedding-int-table"),
    pytest.param(ShapeError, "embedding", [("f32", (10, 4, 2)), ("i64", (3,))], {}, id="embedding-rank"),
]


@pytest.mark.parametrize(("err", "op", "specs", "attrs"), BAD)
def test_infer_errors(err: type[IRError], op: str, specs: Sequence[tuple[str, tuple[Any, ...]]],
                      attrs: Mapping[str, Any]) -> None:
    with pytest.raises(err) as info:
        _try(op, specs, **attrs)
    e = info.value
    assert isinstance(e, IRError)
    assert e.what and e.fix, "every error says what went wrong and how to fix it"
    assert e.where and op in e.where, "errors raised while building name the node"


def test_embedding_reference_rejects_out_of_range_ids() -> None:
    g = GraphBuilder()
    t = g.input("t", "f32", (4, 2))
    ids = g.input("ids", "i64", (2,))
    g.output(g.op("embedding", t, ids))
    with pytest.raises(InputError, match=r"index 4 at position \(1,\)"):  # ONNX: an error, not a wrap
        evaluate(g.build(), {"t": np.zeros((4, 2), np.float32), "ids": np.array([0, 4])})
