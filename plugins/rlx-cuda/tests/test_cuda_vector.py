"""rlx-cuda's vectorised elementwise and layer_norm kernels (``RLX_CUDA_VECTORIZE``,
:func:`rlx_cuda.codegen.elementwise_vec_source` / :func:`~rlx_cuda.codegen.layer_norm_vec_source`).

Without a GPU: the vector plan (which layouts, widths and alignments take the vectorised kernel),
and, where an NVRTC library is found, that the vectorised kernels of real programs (MiniLM's f16
and bf16 GELU chains, bias adds, every elementwise op with its dtypes) compile for sm_90 and sm_80.
On a GPU: fused chains and single ops against the float64 reference (rounded where the graph
rounds) and bit for bit against the scalar kernels (``RLX_CUDA_VECTORIZE=0``), in f16/bf16/f32,
odd sizes (the scalar fallback), bias broadcasts, views at every misaligned offset, bf16 rounding
of special values, and layer_norm with and without the fused residual add.

    pytest plugins/rlx-cuda/tests/test_cuda_vector.py
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cudakit import BOUND, gpu, nvrtc_compile, nvrtc_lib, record_kernels
from rlx_cuda import codegen

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import DType
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(1818)
F16, BF16, F32 = DType.F16, DType.BF16, DType.F32


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "rlx-cache"))
    monkeypatch.delenv("RLX_CUDA_VECTORIZE", raising=False)
    reset_hub(Hub())
    record_kernels(monkeypatch)
    yield
    reset_hub(Hub())


#: MiniLM's GELU as the CUDA dispatch fuses it in f16 (exact erf form, f16 rounding after each op;
#: i1..i3 are the folded f32 constants 1/sqrt(2), 0.5 and 1).
GELU_F16 = ('{"ops":[["cast",["i0"],{"to":{"dtype":"f32"}}],["mul",["t0","i1"],{}],'
            '["cast",["t1"],{"to":{"dtype":"f16"}}],["cast",["t2"],{"to":{"dtype":"f32"}}],["erf",["t3"],{}],'
            '["cast",["t4"],{"to":{"dtype":"f16"}}],["cast",["i0"],{"to":{"dtype":"f32"}}],'
            '["mul",["i2","t6"],{}],["cast",["t7"],{"to":{"dtype":"f16"}}],'
            '["cast",["t5"],{"to":{"dtype":"f32"}}],["add",["i3","t9"],{}],'
            '["cast",["t10"],{"to":{"dtype":"f16"}}],["cast",["t8"],{"to":{"dtype":"f32"}}],'
            '["cast",["t11"],{"to":{"dtype":"f32"}}],["mul",["t12","t13"],{}],'
            '["cast",["t14"],{"to":{"dtype":"f16"}}]],"out":"t15"}')
GELU_CONSTS = (0.70703125, 0.5, 1.0)  # f16(1/sqrt(2)), exactly as the graph's constant


def _gelu(dt: DType) -> str:
    return GELU_F16 if dt is F16 else GELU_F16.replace('"f16"', f'"{dt.value}"')


def _half_add(dt: DType) -> str:
    """An f16/bf16 add as legalised: widen both, add in f32, round once."""
    return ('{"ops":[["cast",["i0"],{"to":{"dtype":"f32"}}],["cast",["i1"],{"to":{"dtype":"f32"}}],'
            f'["add",["t0","t1"],{{}}],["cast",["t2"],{{"to":{{"dtype":"{dt.value}"}}}}]],"out":"t3"}}')


# -- no GPU ---------------------------------------------------------------------------------------

def test_vector_layouts() -> None:
    lays, dims, st = codegen.plan_layouts([(6, 40), (40,)], (6, 40))
    assert codegen.vector_layouts(lays, dims, st) == "fr"  # a bias: a row along the last dim
    lays, dims, st = codegen.plan_layouts([(3, 4), (2, 3, 4)], (2, 3, 4))
    assert codegen.vector_layouts(lays, dims, st) == "rf"  # merged dims: row of 12
    lays, dims, st = codegen.plan_layouts([(6, 8), (6, 1)], (6, 8))
    assert codegen.vector_layouts(lays, dims, st) is None  # a column broadcast: scalar kernel
    lays, dims, st = codegen.plan_layouts([(2, 1, 4)], (2, 3, 4))
    assert codegen.vector_layouts(lays, dims, st) is None
    assert codegen.vector_layouts("fss", [], {}) == "fss"


def test_vector_width() -> None:
    w = codegen.vector_width
    assert w("fsss", [F16, F32, F32, F32], F16, 128 * 1536, 0, [256] * 5) == 8  # 16-byte f16 vectors
    assert w("f", [F16], F32, 64, 0, [256, 256]) == 4  # f32 output: 16 bytes of f32, 8 of f16
    assert w("ff", [F32, F32], F32, 12, 0, [256] * 3) == 4
    assert w("ff", [DType.F64, DType.F64], DType.F64, 6, 0, [256] * 3) == 2
    assert w("f", [F16], F16, 7 * 3, 0, [256, 256]) == 0  # odd size
    assert w("f", [F16], F16, 64, 0, [2, 256]) == 0  # input 2-byte aligned only
    assert w("f", [F16], F16, 64, 0, [4, 256]) == 2
    assert w("f", [F16], F16, 64, 0, [256, 8]) == 4  # output 8-byte aligned
    assert w("fr", [F16, F16], F16, 6 * 12, 12, [256] * 3) == 4  # the row's length bounds it
    assert w("fr", [F16, F16], F16, 6 * 7, 7, [256] * 3) == 0
    assert w("fr", [F16, F16], F16, 6 * 40, 40, [256, 6, 256]) == 0  # misaligned bias
    assert w("fs", [DType.BOOL, F32], DType.BOOL, 64, 0, [256] * 3) == 8  # at most 8 per thread


def test_layer_norm_vec_width() -> None:
    v = codegen.layer_norm_vec
    assert v(384, F16, [256] * 4) == 4  # 96 vectors: 3 per lane, no idle lanes
    assert v(384, F32, [256] * 4) == 4
    assert v(1024, F16, [256] * 4) == 8
    assert v(40, F16, [256] * 4) == 8
    assert v(30, F16, [256] * 4) == 2
    assert v(7, F16, [256] * 4) == 1
    assert v(384, F16, [256, 4, 256, 256]) == 2




def vector_kernels() -> list[tuple[str, str]]:
    """The vectorised kernels of MiniLM's chains and of every elementwise op rlx-cuda claims."""
    from rlx_cuda.plugin import ELEMENTWISE, GEN, STORE

    from rlx_core.ir.schema import REGISTRY
    from rlx_core.ir.types import TensorType

    out = []
    for dt in (F16, BF16):
        for vec in (2, 4, 8):
            out.append(codegen.elementwise_vec_source(_gelu(dt), (dt, F32, F32, F32), dt, "fsss", vec, False))
            out.append(codegen.elementwise_vec_source(_half_add(dt), (dt, dt), dt, "fr", vec, True))
    for op in ELEMENTWISE:
        if op == "cast":
            for src in STORE:
                for to in STORE:
                    p = codegen.single_op_program("cast", 1, {"to": to})
                    v = min(codegen.VEC_MAX, codegen.VEC_BYTES // max(src.itemsize, to.itemsize))
                    out.append(codegen.elementwise_vec_source(p, (src,), to, "f", v, False))
            continue
        schema = REGISTRY.get(op)
        for dt in sorted(set(schema.dtypes) & GEN, key=lambda d: d.value):
            n = len(schema.inputs)
            ins = (DType.BOOL, dt, dt) if op == "where" else (dt,) * n
            odt = schema.infer([TensorType(d, (2,)) for d in ins], schema.check_attrs({}, op))[0].dtype
            prog = codegen.single_op_program(op, n, {})
            v = min(codegen.VEC_MAX, codegen.VEC_BYTES // max(d.itemsize for d in (*ins, odt)))
            out.append(codegen.elementwise_vec_source(prog, ins, odt, "f" * n, v, False))
            out.append(codegen.elementwise_vec_source(prog, ins, odt, "r" + "s" * (n - 1), v, True))
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_vector_kernel_compiles(arch: str) -> None:
    lib = nvrtc_lib()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12 or CuPy): the vectorised kernels are "
                    "NOT compile-checked on this machine")
    sources = vector_kernels()
    assert len(sources) > 40
    # one translation unit (the preamble has an include guard; every kernel name is distinct)
    text = "\n".join(src for _, src in sources)
    rc, log = nvrtc_compile(lib, text, arch, "vec.cu")
    assert rc == 0, f"the vectorised kernels do not compile for {arch}:\n{log[-3000:]}"
    for name, src in sources[:6]:  # and alone, with the bf16 rounding of the vector preamble
        rc, log = nvrtc_compile(lib, src, arch, "vec.cu")
        assert rc == 0, f"{name} does not compile for {arch}:\n{log[-3000:]}"


# -- GPU: graphs ----------------------------------------------------------------------------------

def _vec_ran() -> bool:
    return any(n.startswith("rlx_ewv_") for n in BOUND)


def _bits(a: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(a).reshape(-1)
    return flat.view(np.uint8 if a.dtype.itemsize == 1 else f"u{a.dtype.itemsize}")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that any NaN equals any NaN (the vector preamble's bf16 rounding gives
    the canonical NaN)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(fa)
    return bool(np.array_equal(nan, np.isnan(fb)) and np.array_equal(_bits(a)[~nan.reshape(-1)],
                                                                      _bits(b)[~nan.reshape(-1)]))


CHAINS = ["gelu", "bias_gelu", "tanh_sub", "bias_first", "scale_add"]
SHAPES = [(4, 128, 48), (3, 5, 40), (7, 12), (5, 7)]


def _chain_graph(chain: str, dt: str, shape: tuple[int, ...]) -> Any:
    npdt = DType.parse(dt).np
    g = GraphBuilder(f"chain_{chain}")
    x = g.input("x", dt, shape)
    y = g.input("y", dt, shape)
    p = g.param("p", (RNG.standard_normal(shape[-1:]) * 0.5).astype(npdt))
    if chain == "gelu":
        out = g.op("gelu", x)
    elif chain == "bias_gelu":
        out = g.op("gelu", x + p)
    elif chain == "tanh_sub":
        out = g.op("gelu", x * 0.5, approximate="tanh") - x
    elif chain == "bias_first":
        out = p - x
    else:
        out = x * 0.25 + y
    g.output(out, "z")
    return g.build()


@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_chain_vector_matches_scalar_and_reference(dt: str, chain: str, shape: tuple[int, ...],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _chain_graph(chain, dt, shape)
    npdt = DType.parse(dt).np
    feeds = [{"x": (RNG.standard_normal(shape) * 2).astype(npdt),
              "y": RNG.standard_normal(shape).astype(npdt)} for _ in range(3)]
    exe = Session("cuda", use_cache=False).compile(graph)
    vec = [exe.run(f)["z"] for f in feeds]  # eager, captured, replayed: fresh inputs each time
    ran = _vec_ran()
    monkeypatch.setenv("RLX_CUDA_VECTORIZE", "0")
    BOUND.clear()
    old = Session("cuda", use_cache=False).compile(graph)
    scalar = [old.run(f)["z"] for f in feeds]
    assert not _vec_ran(), "RLX_CUDA_VECTORIZE=0 still bound a vectorised kernel"
    assert ran == (shape[-1] % 2 == 0), (ran, shape)  # odd rows/sizes: the scalar kernel
    tol = {"f32": 2e-6, "f16": 2e-3, "bf16": 1.6e-2}[dt]
    for f, a, b in zip(feeds, vec, scalar):
        assert _same_bits(a, b), f"vectorised and scalar kernels differ ({chain} {dt} {shape})"
        want = evaluate(graph, f)["z"]
        np.testing.assert_allclose(a.astype(np.float64), want, rtol=tol, atol=tol)


# -- GPU: views at every offset -------------------------------------------------------------------

def _bind(program: str, ins: list[Any], in_dts: list[DType], shapes: list[tuple[int, ...]], out: Any,
          out_dt: DType) -> Any:
    import cupy as cp
    from rlx_cuda import kernels

    from rlx_core.ir.types import TensorType

    ctx = types.SimpleNamespace(sm_count=int(cp.cuda.Device().attributes["MultiProcessorCount"]))
    b = kernels.Bound(ins, [out], [TensorType(d, s) for d, s in zip(in_dts, shapes)],
                      [TensorType(out_dt, tuple(out.shape))], {}, ctx)
    return kernels.elementwise(program, b)


def _h(v: Any) -> Any:
    return np.asarray(v, np.float16).astype(np.float64)


@gpu
@pytest.mark.parametrize("x_off", range(8))
@pytest.mark.parametrize("o_off", [0, 1, 2, 4])
def test_gelu_views_at_every_offset(x_off: int, o_off: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """MiniLM's f16 GELU chain on views starting 0..7 elements into their buffers: the widest
    vector the addresses allow (8, 4, 2) or the scalar kernel; the same bits either way, the
    reference's value, and nothing outside the output view written."""
    import cupy as cp

    rows, cols = 33, 96
    n = rows * cols
    x_host = (RNG.standard_normal(n) * 3).astype(np.float16)
    xbuf = cp.zeros(n + 16, np.float16)
    xbuf[x_off:x_off + n] = cp.asarray(x_host)
    x = xbuf[x_off:x_off + n].reshape(rows, cols)
    consts = [cp.asarray(np.float32(c)).reshape(()) for c in GELU_CONSTS]
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RLX_CUDA_VECTORIZE", flag)
        obuf = cp.full(n + 16, np.float16(-7.0), np.float16)
        o = obuf[o_off:o_off + n].reshape(rows, cols)
        BOUND.clear()
        run = _bind(GELU_F16, [x, *consts], [F16, F32, F32, F32], [(rows, cols), (), (), ()], o, F16)
        run()
        cp.cuda.runtime.deviceSynchronize()
        results.append((cp.asnumpy(obuf), _vec_ran()))
    (vec_buf, ran), (old_buf, ran_old) = results
    aligned = x_off % 2 == 0 and o_off % 2 == 0  # (buffers are 256-byte aligned)
    assert ran == aligned and not ran_old, (ran, ran_old, x_off, o_off)
    assert np.array_equal(vec_buf.view(np.uint16), old_buf.view(np.uint16))
    outside = np.r_[vec_buf[:o_off], vec_buf[o_off + n:]]
    assert np.all(outside == np.float16(-7.0)), "a byte outside the output view was written"
    xs = x_host.astype(np.float64)
    s, half, one = GELU_CONSTS
    want = _h(_h(half * xs) * _h(one + _h(np.array([math.erf(v) for v in _h(xs * s)]))))
    np.testing.assert_allclose(vec_buf[o_off:o_off + n].astype(np.float64), want, rtol=2e-3, atol=1e-3)


@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("b_off", [0, 1, 2, 4, 8])
def test_bias_add_views(dt: str, b_off: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """out = x + bias[last axis] (the half add as legalised), the bias at offsets 0..8: same bits
    vectorised and scalar, exact against float64 rounded once."""
    import cupy as cp

    d = DType.parse(dt)
    rows, cols = 19, 40
    x_host = RNG.standard_normal((rows, cols)).astype(d.np)
    b_host = RNG.standard_normal(cols).astype(d.np)
    st = np.dtype(np.uint16)
    x = cp.asarray(x_host.view(st))
    bbuf = cp.zeros(cols + 16, st)
    bbuf[b_off:b_off + cols] = cp.asarray(b_host.view(st))
    bias = bbuf[b_off:b_off + cols]
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RLX_CUDA_VECTORIZE", flag)
        o = cp.zeros((rows, cols), st)
        BOUND.clear()
        _bind(_half_add(d), [x, bias], [d, d], [(rows, cols), (cols,)], o, d)()
        outs.append((cp.asnumpy(o), _vec_ran()))
    (a, ran), (b, _) = outs
    assert ran == (b_off % 2 == 0), (ran, b_off)
    assert np.array_equal(a, b)
    want = (x_host.astype(np.float64) + b_host.astype(np.float64)).astype(np.float32).astype(d.np)
    assert np.array_equal(a, want.view(st))


@gpu
def test_bf16_rounding_of_special_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """f32 -> bf16 through the vector preamble's ``cvt.rn.bf16x2.f32`` and the scalar kernel's
    integer rounding: ties to even, subnormals, the largest finite values, overflow to infinity,
    signed zeros, infinities, NaN (any NaN: payloads are not kept)."""
    import cupy as cp
    import ml_dtypes

    big = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    specials = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, -1.00390625, 1e-39, -1e-39, 3e-45, 1.2e-38,
                         big, -big, 3.3961776e38, 3.4e38, np.inf, -np.inf, np.nan, 65504.0, 1e-8], np.float32)
    bits = RNG.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)  # every kind of float
    x_host = np.concatenate([specials, bits.view(np.float32)])
    x_host = np.concatenate([x_host, np.zeros(-len(x_host) % 8, np.float32)])
    prog = codegen.single_op_program("cast", 1, {"to": BF16})
    x = cp.asarray(x_host)
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RLX_CUDA_VECTORIZE", flag)
        o = cp.zeros(x_host.shape, np.uint16)
        BOUND.clear()
        _bind(prog, [x], [F32], [x_host.shape], o, BF16)()
        outs.append((cp.asnumpy(o).view(ml_dtypes.bfloat16), _vec_ran()))
    (a, ran), (b, _) = outs
    assert ran
    assert _same_bits(a, b), np.nonzero(a.view(np.uint16) != b.view(np.uint16))[0][:10]
    with np.errstate(invalid="ignore", over="ignore"):
        want = x_host.astype(ml_dtypes.bfloat16)  # nearest-even
    assert _same_bits(a, want)


# -- GPU: layer_norm ------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("n", [384, 40, 30, 1000, 7])
@pytest.mark.parametrize("add", [False, True])
def test_layer_norm_vector(dt: str, n: int, add: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """layer_norm (and layer_norm(a + b) with the residual add fused) through the vectorised
    warp-per-row kernel where the row allows it, against the float64 reference and the scalar
    kernel (statistics summed in another order: close, not bit-equal)."""
    npdt = DType.parse(dt).np
    rows = 37
    g = GraphBuilder("ln")
    x = g.input("x", dt, (rows, n))
    y = g.input("y", dt, (rows, n))
    gam = g.param("g", RNG.standard_normal(n).astype(npdt))
    bet = g.param("b", RNG.standard_normal(n).astype(npdt))
    g.output(g.layer_norm(x + y if add else x, gam, bet, eps=1e-5), "z")
    graph = g.build()
    feed = {"x": (RNG.standard_normal((rows, n)) * 3 + 1).astype(npdt),
            "y": RNG.standard_normal((rows, n)).astype(npdt)}
    got = Session("cuda", use_cache=False).compile(graph).run(feed)["z"].astype(np.float64)
    vec = [k for k in BOUND if "layer_norm_w" in k and "v" in k.split("_w", 1)[1]]
    assert bool(vec) == (n % 2 == 0), BOUND
    if add:
        assert any("add_layer_norm" in k for k in BOUND), BOUND
    monkeypatch.setenv("RLX_CUDA_VECTORIZE", "0")
    BOUND.clear()
    old = Session("cuda", use_cache=False).compile(graph).run(feed)["z"].astype(np.float64)
    assert not any("v" in k.split("_w", 1)[1] for k in BOUND if "layer_norm_w" in k)
    want = evaluate(graph, feed)["z"]
    scale = np.abs(want).max()
    tol = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}[dt]
    assert np.abs(got - want).max() / scale < tol
    assert np.abs(got - old).max() / scale < 2 * tol  # each within an ulp of the exact value


# -- GPU: MiniLM's program ------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_minilm_layer_takes_vector_kernels(dt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two MiniLM-L6 layers (random weights of its shapes, padding in the mask) in f16/bf16: the
    GELU chains and the (add +) layer_norms bind vectorised kernels, and the embeddings agree
    with ``RLX_CUDA_VECTORIZE=0`` (layer_norm sums in another order) and with float64."""
    import json

    from rlx_core.models.bert import build_bert_encoder

    spec = json.loads((Path(__file__).resolve().parents[3] / "bench" / "minilm_shapes.json").read_text())
    cfg = dict(spec["config"], num_hidden_layers=2)
    w = {k: (RNG.standard_normal(s) * 0.05).astype(np.float32) for k, s in spec["shapes"].items()}
    for k in w:
        if k.endswith("LayerNorm.weight"):
            w[k] = np.ones_like(w[k])
    graph = build_bert_encoder(cfg, w, dtype=dt, pooling="mean", normalize=True, name=f"minilm2_{dt}")
    ids = RNG.integers(1000, 20000, (3, 24)).astype(np.int64)
    mask = np.ones((3, 24), np.int64)
    mask[1, 17:] = 0
    feed = {"input_ids": ids, "attention_mask": mask}
    got = Session("cuda", use_cache=False).compile(graph).run(feed)["embeddings"].astype(np.float64)
    gelu = [k for k in BOUND if k.startswith("rlx_ewv_")]
    ln = [k for k in BOUND if "layer_norm_w" in k and "v" in k.split("_w", 1)[1]]
    assert gelu and any("add_layer_norm" in k for k in ln), BOUND
    monkeypatch.setenv("RLX_CUDA_VECTORIZE", "0")
    old = Session("cuda", use_cache=False).compile(graph).run(feed)["embeddings"].astype(np.float64)
    want = evaluate(graph, feed)["embeddings"]

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.min((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
    limit = 0.9999 if dt == "f16" else 0.999
    assert cos(got, want) > limit and cos(old, want) > limit and cos(got, old) > limit
