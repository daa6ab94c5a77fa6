"""Small transformer models on rlx-cpu (issue 18): norms written out as primitives fuse into one
kernel, and the small-tensor kernels (fused elementwise, reductions, softmax, norms) match float64
references, NaN and Inf included."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate
from rlx_core.patterns import find_layer_norm, find_rms_norm
from rlx_core.plugin import Attrs, encode_fused

RNG = np.random.default_rng(18)


def _ops(exe: object) -> list[str]:
    return [e.op for e in exe.report.entries]  # type: ignore[attr-defined]


def _kernels(exe: object) -> list[str]:
    return [k for e in exe.report.entries for k in e.kernels]  # type: ignore[attr-defined]


def _onnx_layer_norm(shape: tuple[int, ...], *, pow2: bool = False, gamma_first: bool = False,
                     mean_out: bool = False, eps: float = 1e-5) -> tuple[object, np.ndarray, np.ndarray]:
    """LayerNorm as torch.onnx spells it below opset 17 (ReduceMean, Sub, Pow, ..., Mul, Add)."""
    n = shape[-1]
    g = GraphBuilder("ln")
    x = g.input("x", "f32", shape)
    gamma_v = RNG.standard_normal(n).astype(np.float32)
    beta_v = RNG.standard_normal(n).astype(np.float32)
    gamma, beta = g.param("gamma", gamma_v), g.param("beta", beta_v)
    ax = (len(shape) - 1,)
    mu = g.op("reduce_mean", x, axes=ax, keepdims=True)
    d = x - mu
    sq = g.op("pow", d, g.param("two", np.float32(2.0))) if pow2 else d * d
    var = g.op("reduce_mean", sq, axes=ax, keepdims=True)
    s = g.op("sqrt", var + g.param("eps", np.float32(eps)))
    y = d / s
    y = (gamma * y) if gamma_first else (y * gamma)
    g.output(y + beta, "y")
    if mean_out:
        g.output(mu, "mu")
    return g.build(), gamma_v, beta_v


def _ref_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return (x64 - mu) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("shape", [(1, 8, 32), (8, 8, 32), (4, 256, 384)])  # 4x256x384: the row pool
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("gamma_first", [False, True])
def test_layer_norm_fuses_and_matches(shape: tuple[int, ...], pow2: bool, gamma_first: bool) -> None:
    graph, gamma, beta = _onnx_layer_norm(shape, pow2=pow2, gamma_first=gamma_first)
    assert len(find_layer_norm(graph)) == 1  # type: ignore[arg-type]
    exe = Session("cpu", use_cache=False).compile(graph)
    assert "cpu.layer_norm" in _kernels(exe) and "reduce_mean" not in _ops(exe), exe.report.to_text()
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    x.reshape(-1, shape[-1])[1, 3] = np.nan  # a NaN poisons its row only
    got = exe.run(x=x)["y"]
    want = _ref_layer_norm(x, gamma, beta)
    assert np.isnan(got.reshape(-1, shape[-1])[1]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_not_fused_when_an_intermediate_is_read_outside() -> None:
    graph, gamma, beta = _onnx_layer_norm((2, 4, 16), mean_out=True)
    assert find_layer_norm(graph) == []  # type: ignore[arg-type]
    exe = Session("cpu", use_cache=False).compile(graph)
    x = RNG.standard_normal((2, 4, 16)).astype(np.float32)
    out = exe.run(x=x)
    np.testing.assert_allclose(out["y"], _ref_layer_norm(x, gamma, beta), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["mu"], x.mean(-1, keepdims=True), rtol=1e-6, atol=1e-6)


RmsTail = Callable[[GraphBuilder, object, object], object]


def _rms_graph(shape: tuple[int, ...], form: str, eps: float = 1e-6) -> tuple[object, np.ndarray]:
    """RMSNorm as LLaMA-family exports spell it, in each of the forms the matcher takes."""
    n = shape[-1]
    g = GraphBuilder("rms")
    x = g.input("x", "f32", shape)
    w_v = RNG.standard_normal(n).astype(np.float32)
    w = g.param("w", w_v)
    ax = (len(shape) - 1,)
    ms = g.op("reduce_mean", x * x, axes=ax, keepdims=True)
    a = ms + g.param("eps", np.float32(eps))
    if form == "div_one":
        y = x * (g.param("one", np.float32(1.0)) / g.op("sqrt", a))
    elif form == "div_x":
        y = x / g.op("sqrt", a)
    elif form == "rsqrt":
        y = g.op("rsqrt", a) * x
    else:
        y = x * g.op("reciprocal", g.op("sqrt", a))
    g.output(w * y, "y")
    g.output(x + 1.0, "residual")  # x read outside the norm too (the residual stream)
    return g.build(), w_v


@pytest.mark.parametrize("form", ["div_one", "div_x", "rsqrt", "reciprocal"])
@pytest.mark.parametrize("shape", [(1, 8, 32), (2, 128, 512)])
def test_rms_norm_fuses_and_matches(form: str, shape: tuple[int, ...]) -> None:
    graph, w = _rms_graph(shape, form)
    assert len(find_rms_norm(graph)) == 1  # type: ignore[arg-type]
    exe = Session("cpu", use_cache=False).compile(graph)
    assert "cpu.rms_norm" in _kernels(exe) and "reduce_mean" not in _ops(exe), exe.report.to_text()
    x = (RNG.standard_normal(shape) * 2).astype(np.float32)
    x.reshape(-1, shape[-1])[0, 1] = np.inf
    got = exe.run(x=x)["y"]
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rms_norm_kernel_non_contiguous_input() -> None:
    from rlx_cpu.hir_kernels import k_rms_norm

    x = RNG.standard_normal((16, 6)).astype(np.float32).T  # (6, 16), not C-contiguous
    w = RNG.standard_normal(16).astype(np.float32)
    o = np.empty((6, 16), np.float32)
    with np.errstate(all="ignore"):
        k_rms_norm([x, w], [o], Attrs({"axis": -1, "eps": 1e-6}))()
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(o, x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w, rtol=1e-6)


def test_small_erf_program_is_generated_and_accurate() -> None:
    """GELU (erf) on 512 floats runs generated code (the NumPy erf is ~60 passes); exact to f32."""
    from rlx_cpu.fused import k_fused
    from rlx_cpu.parallel import RowRun

    prog = encode_fused([("div", ["i0", "i1"], {}), ("erf", ["t0"], {}), ("add", ["t1", "i2"], {}),
                         ("mul", ["i0", "t2"], {}), ("mul", ["t3", "i3"], {})], "t4")
    x = (RNG.standard_normal((1, 8, 64)) * 4).astype(np.float32)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    o = np.empty_like(x)
    consts = [np.float32(math.sqrt(2.0)).reshape(()), np.float32(1.0).reshape(()),
              np.float32(0.5).reshape(())]
    run = k_fused([x, *consts], [o], Attrs({"program": prog}))
    assert isinstance(run, RowRun)
    run()
    x64 = x.astype(np.float64)
    want = np.array([v * (math.erf(v / math.sqrt(2.0)) + 1.0) * 0.5 if np.isfinite(v) else np.nan
                     for v in x64.ravel()]).reshape(x.shape)
    want[0, 0, 1], want[0, 0, 2] = np.inf, np.nan  # inf * (1 + 1)/2; -inf * (1 - 1)/2 = -inf * 0
    # 1 + erf(x) cancels for x << 0 in float32 (as in the unfused graph): an error of a few ulp of
    # 1, times |x|, is the float32 program's own rounding, not the kernel's.
    with np.errstate(invalid="ignore"):
        err = np.abs(o.astype(np.float64) - want)
    ok = (err <= 2e-6 * np.abs(want) + 3e-7 * np.abs(x64) + 1e-7) | (np.isnan(o) & np.isnan(want))
    ok |= o == want  # inf
    assert ok.all(), (x64[~ok], o[~ok], want[~ok])


@pytest.mark.parametrize("steps", [3, 2])
def test_small_integer_programs_of_three_steps_are_generated(steps: int) -> None:
    """RoBERTa's position ids (``ne``, ``not``, ``cast``, then index wrapping) on a few int64
    elements: from three steps one generated call (equal to the reference, integers have no
    rounding), below that the NumPy form."""
    from rlx_cpu.fused import k_fused
    from rlx_cpu.parallel import RowRun

    from rlx_core.plugin import REGISTRY, DType

    ops = [("equal", ["i0", "i1"], {}), ("logical_not", ["t0"], {}), ("cast", ["t1"], {"to": DType.I32})]
    ops = ops[:steps]
    ids = np.array([[0, 5, 1, 1, 7, 1, -3, 9]], np.int64)
    ins = [ids, np.int64(1).reshape(())]
    prog = encode_fused(ops, f"t{steps - 1}")
    schema = REGISTRY.get("fused_elementwise")
    want = schema.reference([np.asarray(a) for a in ins], Attrs({"program": prog}))[0]
    o = np.empty(want.shape, want.dtype)
    run = k_fused(ins, [o], Attrs({"program": prog}))
    assert isinstance(run, RowRun) == (steps >= 3)
    run()
    np.testing.assert_array_equal(o, want)


@pytest.mark.parametrize("case", ["broadcast", "compare_where", "cast", "in_place", "int"])
def test_lean_numpy_program_matches_reference(case: str) -> None:
    """The small-tensor NumPy form (buffers made once, ufuncs with out=) against float64."""
    from rlx_cpu.fused import _lean_program, _numpy_program

    from rlx_core.plugin import REGISTRY, DType

    f32 = np.float32
    if case == "broadcast":
        ops = [("div", ["i0", "i1"], {}), ("mul", ["t0", "i2"], {}), ("add", ["t1", "i3"], {})]
        ins = [RNG.standard_normal((2, 8, 32)).astype(f32), RNG.random((2, 8, 1)).astype(f32) + 0.5,
               RNG.standard_normal(32).astype(f32), RNG.standard_normal(32).astype(f32)]
    elif case == "compare_where":
        ops = [("not_equal", ["i0", "i0"], {}), ("where", ["t0", "i1", "i0"], {})]
        x = RNG.standard_normal((4, 8, 8)).astype(f32)
        x[0, 0, :2] = np.nan
        ins = [x, np.zeros(1, f32)]
    elif case == "cast":
        ops = [("mul", ["i0", "i1"], {}), ("cast", ["t0"], {"to": DType.I32}), ("add", ["t1", "i2"], {})]
        ins = [(RNG.standard_normal((3, 5)) * 9).astype(f32), np.float32(1.5).reshape(()),
               np.arange(5, dtype=np.int32)]
    elif case == "in_place":
        ops = [("exp", ["i0"], {}), ("sub", ["t0", "i0"], {})]
        ins = [RNG.standard_normal((6, 7)).astype(f32)]
    else:
        ops = [("mul", ["i0", "i1"], {}), ("maximum", ["t0", "i1"], {}), ("less", ["t1", "i0"], {})]
        ins = [RNG.integers(-9, 9, (4, 6)).astype(np.int64), RNG.integers(-9, 9, (6,)).astype(np.int64)]
    prog = encode_fused(ops, f"t{len(ops) - 1}")
    schema = REGISTRY.get("fused_elementwise")
    want = schema.reference([np.asarray(a) for a in ins], Attrs({"program": prog}))[0]
    o = ins[0] if case == "in_place" else np.empty(want.shape, want.dtype if want.dtype != np.float64
                                                   or ins[0].dtype == np.float64 else f32)
    with np.errstate(all="ignore"):
        assert _lean_program(ins, o, prog) is not None  # binding writes nothing (o may be an input)
        run = _numpy_program(ins, o, prog)
        run()
    np.testing.assert_allclose(o.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_reduce_mean_is_np_mean_bit_for_bit(dtype: type) -> None:
    from rlx_cpu.kernels import reduction

    for shape, axes, keep in [((3, 5, 7), (2,), True), ((3, 5, 7), (0, 2), False), ((4, 0), (1,), True)]:
        x = (RNG.standard_normal(shape) * 100).astype(dtype)
        for f in (np.mean, np.sum, np.prod, np.max):
            if x.size == 0 and f is np.max:
                continue
            kw = {} if f is np.max else {"dtype": dtype}
            with np.errstate(all="ignore"):
                want = f(x, axis=axes, keepdims=keep, **kw)
                o = np.empty(np.shape(want), dtype)
                reduction(f, f is not np.max)([x], [o], Attrs({"axes": axes, "keepdims": keep}))()
            np.testing.assert_array_equal(o, want)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 8, 8), (8, 4, 8, 8), (3, 200)])  # (3, 200): NumPy rows
def test_small_softmax_rows_nan_inf(log: bool, shape: tuple[int, ...]) -> None:
    from rlx_cpu.hir_kernels import k_softmax

    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0, 1] = np.nan  # whole row NaN
    flat[1, 2] = np.inf  # whole row NaN (inf - inf)
    flat[2, :] = -np.inf  # fully masked: NaN
    if flat.shape[0] > 3:
        flat[3, 1:] = -np.inf  # one key left: probability 1
    o = np.empty_like(x)
    with np.errstate(all="ignore"):
        k_softmax([x], [o], Attrs({"axis": -1}), log=log)()
        x64 = x.astype(np.float64)
        m = x64.max(-1, keepdims=True)
        e = np.exp(x64 - m)
        want = (x64 - m) - np.log(e.sum(-1, keepdims=True)) if log else e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(o, want, rtol=2e-6, atol=1e-7)


def test_transformer_block_end_to_end() -> None:
    """A pre-opset-17 encoder block (LayerNorm, GELU with erf, attention) on rlx-cpu against the
    float64 graph reference, with norms fused into single kernels."""
    b, s, h, nh = 2, 8, 32, 4
    g = GraphBuilder("block")
    x = g.input("x", "f32", (b, s, h))

    def lin(t: object, name: str, fan_in: int, fan_out: int) -> object:
        w_v = RNG.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)
        w = g.param(f"{name}.w", w_v.astype(np.float32))
        bias = g.param(f"{name}.b", RNG.standard_normal(fan_out).astype(np.float32) * 0.1)
        return g.op("matmul", t, w) + bias

    def ln(t: object, name: str) -> object:
        mu = g.op("reduce_mean", t, axes=(2,), keepdims=True)
        d = t - mu  # type: ignore[operator]
        var = g.op("reduce_mean", d * d, axes=(2,), keepdims=True)
        y = d / g.op("sqrt", var + g.param(f"{name}.eps", np.float32(1e-12)))
        return y * g.param(f"{name}.g", RNG.random(h).astype(np.float32) + 0.5) + g.param(
            f"{name}.b", RNG.standard_normal(h).astype(np.float32) * 0.1)

    def heads(t: object) -> object:
        return g.op("transpose", g.op("reshape", t, shape=(b, s, nh, h // nh)), perm=(0, 2, 1, 3))

    q, k, v = (heads(lin(x, n, h, h)) for n in ("q", "k", "v"))
    kt = g.op("transpose", k, perm=(0, 1, 3, 2))
    sc = g.op("matmul", q, kt) / g.param("c", np.float32(math.sqrt(h // nh)))
    p = g.op("softmax", sc, axis=-1)
    a = g.op("reshape", g.op("transpose", g.op("matmul", p, v), perm=(0, 2, 1, 3)), shape=(b, s, h))
    x1 = ln(lin(a, "o", h, h) + x, "ln1")
    f = lin(x1, "f1", h, 4 * h)
    erf = g.op("erf", f / g.param("r2", np.float32(math.sqrt(2.0))))
    f = f * 0.5 * (erf + g.param("one", np.float32(1.0)))
    g.output(ln(lin(f, "f2", 4 * h, h) + x1, "ln2"), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    kern = _kernels(exe)
    assert kern.count("cpu.layer_norm") == 2 and "cpu.attention" in kern, exe.report.to_text()
    xv = RNG.standard_normal((b, s, h)).astype(np.float32)
    got = exe.run(x=xv)["y"]
    want = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_norm_rule_ignores_full_reductions() -> None:
    """A mean over every axis (``axes`` unset) is not a norm's, and the rule must not trip on it."""
    g = GraphBuilder("full")
    x = g.input("x", "f32", (3, 4))
    mu = g.op("reduce_mean", x, keepdims=True)
    g.output(x - mu, "y")
    graph = g.build()
    assert find_layer_norm(graph) == [] and find_rms_norm(graph) == []  # type: ignore[arg-type]
    xv = RNG.standard_normal((3, 4)).astype(np.float32)
    got = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    np.testing.assert_allclose(got, xv - xv.astype(np.float64).mean(), rtol=1e-6, atol=1e-6)


def _exported_sdpa(b: int, h: int, s: int, d: int, scale_keys: bool = True) -> object:
    """torch.onnx's masked scaled_dot_product_attention: q and k^T each scaled by sqrt(scale),
    a bool mask turned into a 0/-inf bias, softmax, where(isnan(p), 0, p), @ v."""
    g = GraphBuilder("sdpa")
    q, k, v = (g.input(n, "f32", (b, h, s, d)) for n in ("q", "k", "v"))
    mask = g.input("mask", "bool", (b, 1, s, s))
    c = g.param("c", np.float32(1.0 / math.sqrt(math.sqrt(d))))
    zero = g.param("zero", np.zeros(1, np.float32))
    bias = g.op("where", mask, zero, g.param("ninf", np.full(1, -np.inf, np.float32)))
    kt = g.op("transpose", k, perm=(0, 1, 3, 2))
    # LLaMA exports fold the keys' scale into their RoPE step: then only q is scaled here.
    p = g.op("softmax", g.op("matmul", q * c, kt * c if scale_keys else kt) + bias, axis=-1)
    guarded = g.op("where", g.op("not_equal", p, p), zero, p)
    g.output(g.op("matmul", guarded, v), "o")
    return g.build()


@pytest.mark.parametrize("scale_keys", [True, False])
# (8, 4, 8, 8) and up run across the items (guarded_across): 68 items are two passes, the last
# partial; (40, 4, 16, 16) splits them over the row pool.
@pytest.mark.parametrize("shape", [(1, 4, 8, 8), (8, 4, 8, 8), (17, 4, 8, 8), (40, 4, 16, 16),
                                   (2, 4, 64, 32)])
def test_exported_masked_attention_runs_as_one_kernel(shape: tuple[int, int, int, int],
                                                      scale_keys: bool) -> None:
    from rlx_core.runtime import bind_inputs

    b, h, s, d = shape
    graph = _exported_sdpa(b, h, s, d, scale_keys)
    exe = Session("cpu", use_cache=False).compile(graph)
    q, k, v = (RNG.standard_normal(shape).astype(np.float32) for _ in range(3))
    mask = RNG.random((b, 1, s, s)) > 0.3
    mask[0, 0, 1, :] = False  # a fully masked row: 0 out, not NaN
    q[-1, 0, 2, 0] = np.nan  # a NaN query: its probabilities are NaN, so 0 too
    feed = {"q": q, "k": k, "v": v, "mask": mask}
    got = exe.run(feed)["o"]
    compiled, _, _ = exe._specialise(bind_inputs(exe.graph, feed, "test")[1])
    assert "cpu.attention_guarded" in compiled.kernel_names, compiled.kernel_names
    _, counts = compiled.profile(feed)  # the fused run still counts every claim it replaces
    assert counts["cpu.softmax"] == 1 and counts["cpu.matmul"] == 2, counts
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    with np.errstate(all="ignore"):
        c = 1.0 / math.sqrt(math.sqrt(d))
        sc = q64 @ k64.transpose(0, 1, 3, 2) * (c * c if scale_keys else c) + np.where(mask, 0.0, -np.inf)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    want = np.where(np.isnan(p), 0.0, p) @ v64
    assert not np.isnan(got).any() and (got[0, :, 1] == 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_chain_with_an_outside_reader_is_left_alone() -> None:
    """The probabilities are also a graph output: nothing is fused, results unchanged."""
    g = GraphBuilder("sdpa2")
    q, k, v = (g.input(n, "f32", (1, 2, 4, 4)) for n in ("q", "k", "v"))
    c = g.param("c", np.float32(0.7))
    zero = g.param("zero", np.zeros(1, np.float32))
    p = g.op("softmax", g.op("matmul", q * c, g.op("transpose", k, perm=(0, 1, 3, 2)) * c)
             + g.param("bias", np.zeros((1, 1, 4, 4), np.float32)), axis=-1)
    g.output(g.op("matmul", g.op("where", g.op("not_equal", p, p), zero, p), v), "o")
    g.output(p, "p")
    exe = Session("cpu", use_cache=False).compile(g.build())
    qv, kv, vv = (RNG.standard_normal((1, 2, 4, 4)).astype(np.float32) for _ in range(3))
    out = exe.run(q=qv, k=kv, v=vv)
    sc = (qv.astype(np.float64) * 0.7) @ (kv.astype(np.float64).transpose(0, 1, 3, 2) * 0.7)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    np.testing.assert_allclose(out["p"], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["o"], out["p"].astype(np.float64) @ vv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
@pytest.mark.parametrize("in_place", [False, True])
def test_constant_small_power(exponent: float, in_place: bool) -> None:
    """pow by a constant 2 or 3 runs as multiplies (2.5 stays a power), NaN/Inf/-0 as powf."""
    from rlx_cpu.fused import _numpy_program

    prog = encode_fused([("pow", ["i0", "i1"], {}), ("add", ["t0", "i0"], {})], "t1")
    x = (RNG.standard_normal((4, 16)) * 3).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    e = np.full((), exponent, np.float32)
    e.flags.writeable = False  # a weight: constant for the program
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        want = np.power(x64, exponent) + x64
        scale = np.abs(np.power(x64, exponent)) + np.abs(x64)  # the sum's condition
        o = x if in_place else np.empty_like(x)
        _numpy_program([x, e], o, prog)()
        err = np.abs(o - want)
    same = (o == want) | (np.isnan(o) & np.isnan(want))
    assert (same | (err <= 4e-7 * scale)).all(), (x[~same], o[~same], want[~same])


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "bias"])
@pytest.mark.parametrize("shape", [(8, 4, 8, 8), (17, 4, 5, 8)])
def test_tiny_head_attention_across_items(shape: tuple[int, int, int, int], mask: str) -> None:
    """32+ tiny heads run across the items (attention_across; 68 items: two passes, the last
    partial), every mask kind, against the float64 reference."""
    b, h, s, d = shape
    g = GraphBuilder("tiny_attn")
    q, k, v = (g.input(n, "f32", shape) for n in ("q", "k", "v"))
    feed = {n: RNG.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    if mask in ("padding", "bias"):
        mshape, mdt = ((b, s), "i64") if mask == "padding" else ((b, 1, s, s), "f32")
        m = g.input("m", mdt, mshape)
        feed["m"] = ((RNG.random(mshape) > 0.3).astype(np.int64) if mask == "padding"
                     else RNG.standard_normal(mshape).astype(np.float32))
        if mask == "padding":
            feed["m"][:, 0] = 1  # a fully masked row's softmax is uniform over masked scores
        g.output(g.op("attention", q, k, v, m, mask=mask), "o")
    else:
        g.output(g.op("attention", q, k, v, mask=mask) if mask != "none" else g.op("attention", q, k, v), "o")
    graph = g.build()
    got = Session("cpu", use_cache=False).compile(graph).run(feed)["o"]
    want = evaluate(graph, {n: x.astype(np.float64) if x.dtype == np.float32 else x
                            for n, x in feed.items()})["o"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("b", [8, 1])
def test_masked_attention_reads_its_head_split_transposes_as_views(b: int) -> None:
    """q, k^T and v made by transposes of projections (as exporters split heads) are read as
    strided views where the projections' buffers live to the chain's end (the planner may reuse a
    buffer once its transpose has read it: then the copies stay) and the kernel runs across the
    items (8 x 4 heads): the transposes join the fused chain and no copy of them runs. With 4 heads
    the per-item kernel runs, which reads contiguous operands faster: the copies stay."""
    from rlx_core.runtime import bind_inputs

    h, s, d = 4, 8, 8
    g = GraphBuilder("sdpa_split")
    x = g.input("x", "f32", (b, s, h * d))
    mask = g.input("mask", "bool", (b, 1, s, s))

    zero = g.param("zero", np.zeros(1, np.float32))
    bias = g.op("where", mask, zero, g.param("ninf", np.full(1, -np.inf, np.float32)))
    # The projections first, then the head splits: every projection lives until the attention.
    proj = [g.op("matmul", x, g.param(n, (RNG.standard_normal((h * d, h * d)) / 8).astype(np.float32)))
            for n in ("wq", "wk", "wv")]
    q, k, v = (g.op("transpose", g.op("reshape", y, shape=(b, s, h, d)), perm=(0, 2, 1, 3)) for y in proj)
    c = g.param("c", np.float32(1.0 / math.sqrt(math.sqrt(d))))
    kt = g.op("transpose", k, perm=(0, 1, 3, 2))
    p = g.op("softmax", g.op("matmul", q * c, kt * c) + bias, axis=-1)
    g.output(g.op("matmul", g.op("where", g.op("not_equal", p, p), zero, p), v), "o")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    feed = {"x": RNG.standard_normal((b, s, h * d)).astype(np.float32),
            "mask": RNG.random((b, 1, s, s)) > 0.3}
    feed["mask"][0, 0, 1, :] = False  # a fully masked row: 0 out
    got = exe.run(feed)["o"]
    compiled, _, _ = exe._specialise(bind_inputs(exe.graph, feed, "test")[1])
    names = compiled.kernel_names
    assert "cpu.attention_guarded" in names, names
    assert sum("transpose" in n for n in names) == (0 if b == 8 else 4), names
    _, counts = compiled.profile(feed)  # the absorbed transposes still count as claims
    assert counts["cpu.transpose"] == 4, counts
    want = evaluate(graph, {"x": feed["x"].astype(np.float64), "mask": feed["mask"]})["o"]
    assert (got[0, :, 1] == 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(32, 8, 8), (3, 10), (2, 12, 128)])
def test_short_row_softmax_f32(shape: tuple[int, ...]) -> None:
    """float32 softmax over short rows (one vectorised exp over all rows): NaN or +inf in a row makes
    the row NaN, -inf gives 0, values match the float64 reference."""
    from rlx_cpu.hir_kernels import k_softmax

    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    rows[0, 1], rows[1, 2], rows[2, 0], rows[-1, :] = np.nan, np.inf, -np.inf, -1e30
    o = np.empty_like(x)
    k_softmax([x], [o], {"axis": -1})()
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    assert (np.isnan(o) == np.isnan(want)).all()
    np.testing.assert_allclose(o, want, rtol=3e-6, atol=1e-7)
