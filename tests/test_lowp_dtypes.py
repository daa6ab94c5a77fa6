"""float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), float4e2m1, int4/uint4 and int2/uint2 as RLX storage
dtypes: the dtypes themselves, which ops take them (cast and movement only), casts into and out of
them on rlx-cpu bit for bit against onnx's ReferenceEvaluator (saturate both ways, NaN/Inf, ties to
even, every value of each type), the packed int4/int2 layout of ONNX files (raw and external data),
QuantizeLinear/DequantizeLinear to and from them, and clean refusals where RLX does not compute
on them (arithmetic: cast first)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import ALL_DTYPES, LOWP_DTYPES, LOWP_FLOAT_DTYPES, LOWP_INT_DTYPES, STORAGE_DTYPES, DType
from rlx_core.errors import DTypeError
from rlx_core.ir import REGISTRY

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")

F8 = [DType.F8E4M3FN, DType.F8E5M2, DType.F8E4M3FNUZ, DType.F8E5M2FNUZ]
#: RLX dtype -> ONNX TensorProto code.
CODE = {DType.F8E4M3FN: 17, DType.F8E4M3FNUZ: 18, DType.F8E5M2: 19, DType.F8E5M2FNUZ: 20, DType.U4: 21,
        DType.I4: 22, DType.F4E2M1: 23, DType.U2: 25, DType.I2: 26, DType.F32: 1, DType.F16: 10,
        DType.F64: 11, DType.BF16: 16, DType.U8: 2, DType.I8: 3, DType.I16: 5, DType.I32: 6,
        DType.I64: 7, DType.BOOL: 9}


@pytest.fixture(autouse=True, scope="module")
def _cpu_only() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLX_BACKENDS", "cpu")
        reset_hub(Hub())
        yield
    reset_hub(Hub())


def _every(dt: DType) -> np.ndarray:
    """Every value of a low-precision type (every bit pattern of the floats, NaNs included)."""
    if dt.is_float:
        return np.arange(16 if dt is DType.F4E2M1 else 256, dtype=np.uint8).view(dt.np)
    info = ml_dtypes.iinfo(dt.np)
    return np.arange(int(info.min), int(info.max) + 1).astype(dt.np)


def _rounding_probes(to: DType) -> np.ndarray:
    """float32 values that test a cast into float type ``to``: its values, the midpoints between
    neighbours (ties to even) and one float32 ulp either side, overflow, +-Inf, NaN, -0, tiny."""
    v = _every(to).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mid = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    top = float(v.max())
    extra = np.array([top * 1.03, top * 1.0625, top * 1.2, top * 4, -top * 1.5, 3e38, np.inf, -np.inf,
                      np.nan, -0.0, float(v[v > 0].min()) / 3, -float(v[v > 0].min()) * 0.5], np.float32)
    return np.concatenate([v.astype(np.float32), mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(-np.inf)), extra])


def _same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Equal dtype, shape and bits, except that any NaN matches any NaN (the payload is free)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.dtype.kind in "iub" or got.dtype in (np.dtype(d.np) for d in LOWP_INT_DTYPES):
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    gn, wn = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(gn, wn, err_msg=f"{what}: NaN positions")
    gb = got.view(np.uint8 if got.dtype.itemsize == 1 else np.uint16 if got.dtype.itemsize == 2 else
                  np.uint32 if got.dtype.itemsize == 4 else np.uint64)
    wb = want.view(gb.dtype)
    bad = (gb != wb) & ~gn
    assert not bad.any(), (f"{what}: {int(bad.sum())} element(s) differ, first at "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]!r}, expected {want[bad][0]!r}")


def _model(nodes: Sequence[Any], inputs: Sequence[tuple[str, int, Sequence[int]]],
           outputs: Sequence[tuple[str, int]], opset: int = 23,
           inits: dict[str, np.ndarray] | None = None) -> Any:
    from onnx import helper, numpy_helper

    ins = [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs]
    graph = helper.make_graph(list(nodes), "lowp", ins,
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _run_both(m: Any, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(rlx-cpu's outputs, onnx ReferenceEvaluator's) of model ``m``."""
    from onnx.reference import ReferenceEvaluator

    from rlx_core.frontends.onnx import load_onnx

    with np.errstate(all="ignore"):
        want = [np.asarray(w) for w in ReferenceEvaluator(m).run(None, feeds)]
    graph = load_onnx(m)
    out = Session("cpu", use_cache=False).compile(graph).run(feeds)
    return [np.asarray(out[o.name]) for o in m.graph.output], want


# -- the dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt,name", [(DType.F8E4M3FN, "float8_e4m3fn"), (DType.F8E5M2, "float8_e5m2"),
                                     (DType.F8E4M3FNUZ, "float8_e4m3fnuz"),
                                     (DType.F8E5M2FNUZ, "float8_e5m2fnuz"), (DType.F4E2M1, "float4_e2m1fn"),
                                     (DType.I4, "int4"), (DType.U4, "uint4"), (DType.I2, "int2"),
                                     (DType.U2, "uint2")])
def test_dtype_facts(dt: DType, name: str) -> None:
    assert dt.np == np.dtype(getattr(ml_dtypes, name)) and dt.itemsize == 1 and dt.is_lowp
    assert DType.parse(str(dt)) is dt and DType.parse(name) is dt and DType.parse(dt.np) is dt
    assert dt.is_float == (dt in LOWP_FLOAT_DTYPES) and dt.is_int == (dt in LOWP_INT_DTYPES)
    assert dt.is_signed == (dt not in (DType.U4, DType.U2))
    assert dt not in ALL_DTYPES and dt in STORAGE_DTYPES


def test_only_cast_and_movement_take_them() -> None:
    takers = sorted(n for n in REGISTRY.names() if set(LOWP_DTYPES) <= set(REGISTRY.get(n).dtypes))
    assert takers == ["cast", "concat", "gather", "reshape", "slice", "transpose", "where"]
    assert not any(set(LOWP_DTYPES) & set(REGISTRY.get(n).dtypes) for n in REGISTRY.names()
                   if n not in takers)
    g = GraphBuilder("a")
    x = g.input("x", DType.F8E4M3FN, (3,))
    with pytest.raises(DTypeError, match="f8e4m3fn"):
        g.op("add", x, x)


def test_movement_ops_keep_every_bit_on_cpu() -> None:
    for dt in LOWP_DTYPES:
        vals = _every(dt)
        x = np.resize(vals, (4, 2 * vals.size // 4 + 3))
        cond = (np.arange(x.size).reshape(x.shape) % 3) == 0
        idx = np.array([2, 0, -1], np.int64)
        g = GraphBuilder("m")
        a = g.input("a", dt, x.shape)
        c = g.input("c", DType.BOOL, x.shape)
        i = g.input("i", DType.I64, (3,))
        g.output(g.op("transpose", a, perm=(1, 0)), "t")
        g.output(g.op("reshape", a, shape=(2, -1)), "r")
        g.output(g.op("slice", a, starts=(1, 0), stops=(4, 100), axes=None, steps=(2, 3)), "s")
        last = g.op("slice", a, starts=(3,), stops=(4,), axes=(0,), steps=(1,))
        g.output(g.op("concat", a, last, axis=0), "k")
        g.output(g.op("gather", a, i, axis=0), "gt")
        g.output(g.op("where", c, a, g.op("transpose", g.op("transpose", a, perm=(1, 0)), perm=(1, 0))), "w")
        exe = Session("cpu", use_cache=False).compile(g.build())
        y = {k: np.asarray(v) for k, v in exe.run({"a": x, "c": cond, "i": idx}).items()}
        _same(y["t"], x.T.copy(), f"transpose {dt}")
        _same(y["r"], x.reshape(2, -1), f"reshape {dt}")
        _same(y["s"], x[1:4:2, 0:100:3], f"slice {dt}")
        _same(y["k"], np.concatenate([x, x[3:4]]), f"concat {dt}")
        _same(y["gt"], x[[2, 0, 3]], f"gather {dt}")
        _same(y["w"], x, f"where {dt}")


# -- casts, bit for bit against onnx's reference ---------------------------------------------------

@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("to", F8 + [DType.F4E2M1])
def test_cast_into_float8_float4_matches_reference(to: DType, saturate: int) -> None:
    from onnx import TensorProto, helper

    x = _rounding_probes(to)
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    srcs = {"x32": x, "x16": x16, "x64": x.astype(np.float64) * (1 + 2.0**-40),
            "xi": np.array([0, 1, -3, 17, 100, 239, 241, 250, 448, 449, 460, 1000, 57344, 61440, -70000],
                           np.int32),
            "xu": np.arange(0, 256, 5, dtype=np.uint8)}
    attrs: dict[str, Any] = {} if to is DType.F4E2M1 else {"saturate": saturate}
    nodes = [helper.make_node("Cast", [k], [f"y_{k}"], to=CODE[to], **attrs) for k in srcs]
    types = {"x32": TensorProto.FLOAT, "x16": TensorProto.FLOAT16, "x64": TensorProto.DOUBLE,
             "xi": TensorProto.INT32, "xu": TensorProto.UINT8}
    m = _model(nodes, [(k, types[k], v.shape) for k, v in srcs.items()], [(f"y_{k}", CODE[to]) for k in srcs])
    got, want = _run_both(m, srcs)
    for k, g, w in zip(srcs, got, want):
        _same(g, w, f"Cast {k} -> {to} saturate={saturate}")


def test_cast_saturate_semantics_by_hand() -> None:
    """The values the ONNX spec's table gives, independent of any implementation."""
    from onnx import TensorProto, helper

    x = np.array([np.inf, -np.inf, 1e6, np.nan, 464.0, 447.0, 17.0], np.float32)
    nodes = [helper.make_node("Cast", ["x"], [f"s{s}"], to=CODE[DType.F8E4M3FN], saturate=s) for s in (0, 1)]
    nodes += [helper.make_node("Cast", ["x"], [f"e{s}"], to=CODE[DType.F8E5M2], saturate=s) for s in (0, 1)]
    m = _model(nodes, [("x", TensorProto.FLOAT, x.shape)],
               [("s0", 17), ("s1", 17), ("e0", 19), ("e1", 19)])
    got, _ = _run_both(m, {"x": x})
    f = [g.astype(np.float64) for g in got]
    nan = np.nan
    # e4m3fn has no Inf: overflow is NaN without saturation, 448 with; 464, the tie between 448 and
    # the NaN code, rounds to even (448).
    np.testing.assert_array_equal(f[0], [nan, nan, nan, nan, 448, 448, 16])
    np.testing.assert_array_equal(f[1], [448, -448, 448, nan, 448, 448, 16])
    np.testing.assert_array_equal(f[2], [np.inf, -np.inf, np.inf, nan, 448, 448, 16])
    np.testing.assert_array_equal(f[3], [57344, -57344, 57344, nan, 448, 448, 16])


@pytest.mark.parametrize("src", LOWP_DTYPES)
def test_cast_out_of_every_value_matches_reference(src: DType) -> None:
    from onnx import TensorProto, helper

    x = _every(src)
    finite = x if src.is_int else x[np.isfinite(x.astype(np.float64))]
    targets = [DType.F32, DType.F16, DType.F64, DType.BOOL] + ([DType.I32, DType.I8] if src.is_int else [])
    nodes = [helper.make_node("Cast", ["x"], [f"y{i}"], to=CODE[t]) for i, t in enumerate(targets)]
    nodes.append(helper.make_node("Cast", ["xf"], ["yi"], to=TensorProto.INT32))
    m = _model(nodes, [("x", CODE[src], x.shape), ("xf", CODE[src], finite.shape)],
               [(f"y{i}", CODE[t]) for i, t in enumerate(targets)] + [("yi", TensorProto.INT32)])
    got, want = _run_both(m, {"x": x, "xf": finite})
    for t, g, w in zip(targets + [DType.I32], got, want):
        _same(g, w, f"Cast {src} -> {t}")


@pytest.mark.parametrize("to", LOWP_INT_DTYPES)
def test_cast_into_int4_int2_matches_reference(to: DType) -> None:
    from onnx import TensorProto, helper

    info = ml_dtypes.iinfo(to.np)
    lo, hi = int(info.min), int(info.max)
    f = np.concatenate([np.arange(lo, hi + 1) + d for d in (0.0, 0.25, 0.5, 0.75, -0.5)])
    f = f[(f > lo - 1) & (f < hi + 1)].astype(np.float32)  # truncation keeps them in range
    ints = np.arange(-40, 40, dtype=np.int32)  # out of range: wraps, as onnx's reference (ml_dtypes) does
    nodes = [helper.make_node("Cast", ["f"], ["yf"], to=CODE[to]),
             helper.make_node("Cast", ["i"], ["yi"], to=CODE[to])]
    m = _model(nodes, [("f", TensorProto.FLOAT, f.shape), ("i", TensorProto.INT32, ints.shape)],
               [("yf", CODE[to]), ("yi", CODE[to])])
    got, want = _run_both(m, {"f": f, "i": ints})
    _same(got[0], want[0], f"float -> {to}")
    _same(got[1], want[1], f"int32 -> {to}")


def test_castlike_and_float8_to_float8() -> None:
    from onnx import helper

    x = _every(DType.F8E5M2)
    like = np.zeros(1, ml_dtypes.float8_e4m3fnuz)
    nodes = [helper.make_node("CastLike", ["x", "like"], ["y"]),
             helper.make_node("CastLike", ["x", "like"], ["y0"], saturate=0)]
    m = _model(nodes, [("x", CODE[DType.F8E5M2], x.shape), ("like", CODE[DType.F8E4M3FNUZ], (1,))],
               [("y", 18), ("y0", 18)])
    got, want = _run_both(m, {"x": x, "like": like})
    _same(got[1], want[1], "CastLike e5m2 -> e4m3fnuz saturate=0")
    _same(got[0], want[0], "CastLike e5m2 -> e4m3fnuz saturate=1")
    # saturate=1 clamps at e4m3fnuz's largest finite value, 240, which e5m2 cannot represent.
    xf, out = x.astype(np.float64), got[0].astype(np.float64)
    assert np.all(np.abs(out[~np.isnan(xf) & (np.abs(xf) > 240)]) == 240)
    assert np.all(np.isnan(out[np.isnan(xf)]))


# -- int4/int2 packing in ONNX files ---------------------------------------------------------------

@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("dt", [DType.I4, DType.U4, DType.I2, DType.U2, DType.F4E2M1])
def test_packed_initializer_round_trip_through_file(tmp_path: Path, dt: DType, external: bool) -> None:
    """An odd element count (the last byte half used) read from raw_data or external data."""
    from onnx import TensorProto, helper, numpy_helper

    from rlx_core.frontends.onnx import load_onnx

    rng = np.random.default_rng(3)
    w = rng.choice(_every(dt), size=(5, 7))  # 35 elements: 18 bytes (int4/float4), 9 (int2)
    t = numpy_helper.from_array(w, "w")
    assert len(t.raw_data) == (35 * (2 if dt in (DType.I2, DType.U2) else 4) + 7) // 8
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Cast", ["wt"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["wf", "x"], ["y"])]
    graph = helper.make_graph(nodes, "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("wt", CODE[dt], None)], initializer=[t])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    path = tmp_path / "p.onnx"
    if external:
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="p.data",
                        size_threshold=0)
        assert (tmp_path / "p.data").stat().st_size == len(t.raw_data)
    else:
        onnx.save_model(m, path)
    x = np.arange(35, dtype=np.float32).reshape(7, 5)
    out = Session("cpu", use_cache=False).compile(load_onnx(path)).run({"x": x})
    _same(np.asarray(out["wt"]), np.ascontiguousarray(w.T), f"{dt} initializer")
    np.testing.assert_array_equal(np.asarray(out["y"]), w.T.astype(np.float32) + x)


# -- QuantizeLinear / DequantizeLinear ------------------------------------------------------------

@pytest.mark.parametrize("qt,saturate", [(q, 1) for q in LOWP_DTYPES] + [(q, 0) for q in F8])
def test_quantize_dequantize_match_reference(qt: DType, saturate: int) -> None:
    """``saturate`` is a float8 attribute: the other types are tested with its default only."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 8)) * 40).astype(np.float32)
    x[0, :4] = [1e9, -1e9, 0.5, -0.0]
    scale = np.array([0.5, 2.0, 7.0], np.float32)
    zp = np.zeros(3, qt.np) if qt.is_float else np.array([1, 0, -1 if qt.is_signed else 2]).astype(qt.np)
    attrs: dict[str, Any] = {"saturate": saturate} if qt in F8 else {}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=0, **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"], axis=0),
             helper.make_node("DequantizeLinear", ["qin", "s", "zp"], ["d2"], axis=0)]
    qin = np.resize(_every(qt), (3, 8))
    m = _model(nodes, [("x", TensorProto.FLOAT, x.shape), ("qin", CODE[qt], qin.shape)],
               [("q", CODE[qt]), ("d", TensorProto.FLOAT), ("d2", TensorProto.FLOAT)],
               inits={"s": scale, "zp": zp})
    got, want = _run_both(m, {"x": x, "qin": qin})
    for name, g, w in zip("q d d2".split(), got, want):
        _same(g, w, f"{name} {qt} saturate={saturate}")


def test_int4_weight_dequantize_matmul_matches_reference() -> None:
    """The usual int4 weight-only model: a blocked int4 initializer dequantized into a MatMul."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(7)
    w = rng.integers(-8, 8, size=(8, 6)).astype(ml_dtypes.int4)
    scale = rng.uniform(0.01, 0.1, size=(2, 6)).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=4),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    m = _model(nodes, [("x", TensorProto.FLOAT, (3, 8))], [("y", TensorProto.FLOAT)],
               inits={"w": w, "s": scale})
    x = rng.standard_normal((3, 8)).astype(np.float32)
    got, want = _run_both(m, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


# -- refusals --------------------------------------------------------------------------------------

def test_arithmetic_on_float8_is_refused_cleanly() -> None:
    from onnx import helper

    from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx

    m = _model([helper.make_node("Add", ["a", "b"], ["c"])], [("a", 17, (3,)), ("b", 17, (3,))], [("c", 17)])
    with pytest.raises(UnsupportedOnnxError, match=r"Add on f8e4m3fn(.|\n)*Cast"):
        load_onnx(m)


def test_nonzero_float8_zero_point_is_refused() -> None:
    from onnx import TensorProto, helper

    from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx

    m = _model([helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"])], [("q", 17, (4,))],
               [("d", TensorProto.FLOAT)],
               inits={"s": np.array(2.0, np.float32), "zp": np.array(1.0, ml_dtypes.float8_e4m3fn)})
    with pytest.raises(UnsupportedOnnxError, match="zero point that is not 0"):
        load_onnx(m)


def test_safetensors_refuses_types_without_a_code(tmp_path: Path) -> None:
    from rlx_core.errors import SerializationError
    from rlx_core.formats.safetensors import read_safetensors, write_safetensors

    ok = {"a": _every(DType.F8E4M3FN), "b": _every(DType.F8E5M2)}
    write_safetensors(tmp_path / "ok.safetensors", ok)
    back, _ = read_safetensors(tmp_path / "ok.safetensors")
    for k, v in ok.items():
        _same(np.asarray(back[k]), v, k)
    with pytest.raises(SerializationError, match="int4"):
        write_safetensors(tmp_path / "bad.safetensors", {"c": _every(DType.I4)})
