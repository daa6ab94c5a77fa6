"""u16/u32/u64: the dtypes themselves, their exact (wrapping, unsigned) semantics on rlx-cpu against
NumPy, the .rlx/safetensors round trip, and ONNX models on UINT tensors against onnx's
ReferenceEvaluator. Values sit at the top of each range, where a signed, narrower or float
implementation would go wrong."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import INT_DTYPES, WIDE_UINT_DTYPES, DType
from rlx_core.errors import DTypeError
from rlx_core.ir import REGISTRY
from rlx_core.ir.reference import evaluate

UINTS = [DType.U16, DType.U32, DType.U64]


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def _top(dt: DType, n: int, seed: int = 0) -> np.ndarray:
    """``n`` values, half from the top 256 of the range (above 2**63 for u64), half anywhere."""
    info = np.iinfo(dt.np)
    rng = np.random.default_rng(seed)
    hi = rng.integers(int(info.max) - 255, int(info.max), size=n, endpoint=True, dtype=dt.np)
    anyv = rng.integers(0, int(info.max), size=n, endpoint=True, dtype=dt.np)
    return np.where(rng.random(n) < 0.5, hi, anyv).astype(dt.np)


def _run(build: Callable[[GraphBuilder], None], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    g = GraphBuilder("u")
    build(g)
    graph = g.build()
    return {k: np.asarray(v) for k, v in Session("cpu", use_cache=False).compile(graph).run(feeds).items()}


# -- the dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt,name,size", [(DType.U16, "uint16", 2), (DType.U32, "uint32", 4),
                                          (DType.U64, "uint64", 8)])
def test_dtype_facts(dt: DType, name: str, size: int) -> None:
    assert DType.parse(str(dt)) is dt and DType.parse(name) is dt and DType.parse(np.dtype(name)) is dt
    assert dt.np == np.dtype(name) and dt.itemsize == size
    assert dt.is_int and not dt.is_signed and not dt.is_float and not dt.is_bool
    # Opt-in per op family: the core integer group (bitwise ops, matmul, conv2d, ...) is unchanged.
    assert dt in WIDE_UINT_DTYPES and dt not in INT_DTYPES


def test_op_families_take_them_deliberately() -> None:
    takes = {"add", "sub", "mul", "div", "maximum", "minimum", "equal", "not_equal", "less", "less_equal",
             "greater", "greater_equal", "where", "cast", "reshape", "transpose", "expand", "slice",
             "concat", "pad", "gather", "reduce_sum", "reduce_max", "reduce_min", "topk_indices"}
    refuses = {"neg", "abs", "sign", "matmul", "conv2d", "cumsum", "reduce_prod", "argmax", "iota"}
    for op in takes:
        assert set(UINTS) <= set(REGISTRY.get(op).dtypes), op
    for op in refuses:
        assert not set(UINTS) & set(REGISTRY.get(op).dtypes), op
    g = GraphBuilder("neg")
    with pytest.raises(DTypeError, match="neg"):
        g.op("neg", g.input("x", "u32", (2,)))


# -- exact semantics on rlx-cpu -------------------------------------------------------------------

# Large enough for rlx-cpu's threaded/row paths as well as the small-tensor ones.
@pytest.mark.parametrize("n", [7, 20000])
@pytest.mark.parametrize("dt", UINTS)
def test_wraparound_and_compare(dt: DType, n: int) -> None:
    a, b = _top(dt, n, 1), _top(dt, n, 2)
    b[::5] = 3  # small against huge: a signed view of u64 would get these comparisons wrong
    b[1::7] = 0

    def build(g: GraphBuilder) -> None:
        x, y = g.input("a", dt, (n,)), g.input("b", dt, (n,))
        g.output(g.op("add", x, y), "add")
        g.output(g.op("sub", y, x), "sub")
        g.output(g.op("mul", x, y), "mul")
        g.output(g.op("div", x, y), "div")
        g.output(g.op("greater", x, y), "gt")
        g.output(g.op("less_equal", x, y), "le")
        g.output(g.op("maximum", x, y), "max")
        g.output(g.op("minimum", x, y), "min")
        g.output(g.op("where", g.op("less", x, y), x, y), "where")

    got = _run(build, {"a": a, "b": b})
    with np.errstate(all="ignore"):
        want = {"add": a + b, "sub": b - a, "mul": a * b, "gt": a > b, "le": a <= b,
                "max": np.maximum(a, b), "min": np.minimum(a, b), "where": np.where(a < b, a, b),
                "div": np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(dt.np)}
    for k, w in want.items():
        assert got[k].dtype == w.dtype, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)
    if dt is DType.U64:  # the cases the brief names: above 2**63, compared unsigned
        big = a >= np.uint64(1 << 63)
        assert big.any() and (got["gt"][big & (b == 3)]).all()


@pytest.mark.parametrize("dt", UINTS)
def test_reductions_wrap(dt: DType) -> None:
    x = _top(dt, 4 * 4096, 3).reshape(4, 4096)

    def build(g: GraphBuilder) -> None:
        v = g.input("x", dt, x.shape)
        g.output(g.op("reduce_sum", v, axes=(1,)), "sum")
        g.output(g.op("reduce_max", v, axes=None), "max")
        g.output(g.op("reduce_min", v, axes=(0,)), "min")

    got = _run(build, {"x": x})
    # NumPy sums u16/u32 in u64; modulo 2**bits that is the wrapping sum in the type itself.
    np.testing.assert_array_equal(got["sum"], x.sum(axis=1, dtype=dt.np))
    np.testing.assert_array_equal(got["max"], x.max())
    np.testing.assert_array_equal(got["min"], x.min(axis=0))


@pytest.mark.parametrize("dt", UINTS)
def test_movement_keeps_every_bit(dt: DType) -> None:
    x = _top(dt, 24, 4).reshape(2, 3, 4)
    idx = np.array([2, 0, 2], np.int64)

    def build(g: GraphBuilder) -> None:
        v = g.input("x", dt, x.shape)
        g.output(g.op("transpose", v, perm=(2, 0, 1)), "t")
        g.output(g.op("concat", v, v, axis=1), "c")
        g.output(g.op("gather", v, g.input("i", DType.I64, (3,)), axis=1), "g")
        g.output(g.op("pad", v, pads=(0, 1, 0, 0, 0, 1), value=7.0), "p")  # begins, then ends

    got = _run(build, {"x": x, "i": idx})
    np.testing.assert_array_equal(got["t"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(got["c"], np.concatenate([x, x], axis=1))
    np.testing.assert_array_equal(got["g"], np.take(x, idx, axis=1))
    np.testing.assert_array_equal(got["p"], np.pad(x, ((0, 0), (1, 0), (0, 1)), constant_values=7))


@pytest.mark.parametrize("src", UINTS)
@pytest.mark.parametrize("to", [DType.I64, DType.U8, DType.U64, DType.I32, DType.F64, DType.F32, DType.BOOL])
def test_cast_matches_numpy(src: DType, to: DType) -> None:
    x = _top(src, 64, 5)
    x[:4] = [0, 1, 1 << 8, (1 << 8) - 1]

    def build(g: GraphBuilder) -> None:
        g.output(g.op("cast", g.input("x", src, x.shape), to=to), "y")

    got = _run(build, {"x": x})["y"]
    want = x != 0 if to is DType.BOOL else x.astype(to.np)  # wraps; u64 -> f32/f64 rounds to nearest
    assert got.dtype == to.np
    np.testing.assert_array_equal(got, want)


def test_cast_round_trips_and_f64_limits() -> None:
    # u32 -> i64 -> u32 and u64 -> i64 -> u64 are lossless (the i64 step wraps and unwraps).
    u32 = _top(DType.U32, 50, 6)
    u64 = _top(DType.U64, 50, 7)
    # f64 holds integers exactly up to 2**53; above that u64 -> f64 rounds to nearest even, and the
    # largest f64 below 2**64 converts back exactly.
    edges = np.array([(1 << 53), (1 << 53) + 1, (1 << 63) + 1025, (1 << 64) - 1], np.uint64)
    back = np.array([2.0**53, 2.0**63, 18446744073709549568.0], np.float64)

    def build(g: GraphBuilder) -> None:
        a = g.input("a", DType.U32, u32.shape)
        b = g.input("b", DType.U64, u64.shape)
        g.output(g.op("cast", g.op("cast", a, to=DType.I64), to=DType.U32), "a2")
        g.output(g.op("cast", g.op("cast", b, to=DType.I64), to=DType.U64), "b2")
        g.output(g.op("cast", g.input("e", DType.U64, edges.shape), to=DType.F64), "e64")
        g.output(g.op("cast", g.input("f", DType.F64, back.shape), to=DType.U64), "f2u")

    got = _run(build, {"a": u32, "b": u64, "e": edges, "f": back})
    np.testing.assert_array_equal(got["a2"], u32)
    np.testing.assert_array_equal(got["b2"], u64)
    np.testing.assert_array_equal(got["e64"], np.array([2.0**53, 2.0**53, 2.0**63 + 2048, 2.0**64]))
    np.testing.assert_array_equal(got["f2u"], np.array([1 << 53, 1 << 63, (1 << 64) - 2048], np.uint64))


def test_reference_division_is_unsigned() -> None:
    """The float64 reference itself: u64 division must not go through int64."""
    g = GraphBuilder("d")
    a, b = g.input("a", DType.U64, (3,)), g.input("b", DType.U64, (3,))
    g.output(g.op("div", a, b), "q")
    x = np.array([(1 << 64) - 1, 1 << 63, 10], np.uint64)
    y = np.array([3, 0, (1 << 63) + 1], np.uint64)
    q = evaluate(g.build(), {"a": x, "b": y})["q"]
    np.testing.assert_array_equal(q, np.array([((1 << 64) - 1) // 3, 0, 0], np.uint64))


def test_rlx_file_round_trip(tmp_path: Path) -> None:
    from rlx_core.ir.serialize import load, save

    ws = {dt: _top(dt, 6, 8).reshape(2, 3) for dt in UINTS}
    g = GraphBuilder("w")
    x = g.input("x", DType.U64, (2, 3))
    g.output(x + g.op("cast", g.param("w16", ws[DType.U16]), to=DType.U64), "y16")
    g.output(x + g.op("cast", g.param("w32", ws[DType.U32]), to=DType.U64), "y32")
    g.output(x + g.param("w64", ws[DType.U64]), "y64")
    path = tmp_path / "u.rlx"
    save(g.build(), path)
    back = load(path)
    for dt in UINTS:
        w = back.weights[f"w{dt.itemsize * 8}"]
        assert np.asarray(w).dtype == dt.np
        np.testing.assert_array_equal(np.asarray(w), ws[dt])


# -- ONNX -------------------------------------------------------------------------------------------

onnx = pytest.importorskip("onnx")


def _model(nodes: Sequence[Any], inputs: Sequence[tuple[str, int, Sequence[int]]],
           outputs: Sequence[tuple[str, int]], opset: int = 18,
           inits: dict[str, np.ndarray] | None = None) -> Any:
    from onnx import helper, numpy_helper

    ins = [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs]
    graph = helper.make_graph(list(nodes), "u", ins,
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_onnx_uint32_model_matches_reference_evaluator() -> None:
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from rlx_core.frontends.onnx import load_onnx

    u32, u64 = TensorProto.UINT32, TensorProto.UINT64
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["p"]),
             helper.make_node("Div", ["p", "d"], ["q"]),
             helper.make_node("Mod", ["p", "d"], ["r"]),
             helper.make_node("Less", ["a", "b"], ["lt"]),
             helper.make_node("Max", ["a", "b", "q"], ["mx"]),
             helper.make_node("Where", ["lt", "r", "mx"], ["w"]),
             helper.make_node("Cast", ["w"], ["w64"], to=u64),
             helper.make_node("Sub", ["w64", "big"], ["y"]),
             helper.make_node("ReduceMax", ["y"], ["ymax"], keepdims=0),
             helper.make_node("Reshape", ["w", "shape"], ["wr"])]
    m = _model(nodes, [("a", u32, (3, 4)), ("b", u32, (3, 4)), ("d", u32, (3, 4)), ("big", u64, (4,))],
               [("y", u64), ("ymax", u64), ("wr", u32), ("lt", TensorProto.BOOL)],
               inits={"shape": np.array([4, 3], np.int64)})
    rng = np.random.default_rng(9)
    feeds = {"a": _top(DType.U32, 12, 10).reshape(3, 4), "b": _top(DType.U32, 12, 11).reshape(3, 4),
             "d": rng.integers(1, 1 << 32, size=(3, 4), dtype=np.uint32),
             "big": np.array([0, 1, (1 << 64) - 1, 1 << 63], np.uint64)}
    feeds["d"][0, :2] = [1, (1 << 32) - 1]
    want = ReferenceEvaluator(m).run(None, feeds)
    graph = load_onnx(m)
    out = Session("cpu", use_cache=False).compile(graph).run(feeds)
    for name, w in zip(("y", "ymax", "wr", "lt"), want):
        got = np.asarray(out[name])
        assert got.dtype == np.asarray(w).dtype, name
        np.testing.assert_array_equal(got, w, err_msg=name)


def test_onnx_bitwise_on_u64_is_refused_cleanly() -> None:
    from onnx import TensorProto, helper

    from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx

    if DType.U64 in REGISTRY.get("bitwise_and").dtypes:
        pytest.skip("bitwise_and takes u64 now: the ONNX node suite covers it")
    m = _model([helper.make_node("BitwiseAnd", ["a", "b"], ["y"])],
               [("a", TensorProto.UINT64, (3,)), ("b", TensorProto.UINT64, (3,))],
               [("y", TensorProto.UINT64)])
    with pytest.raises(UnsupportedOnnxError, match="BitwiseAnd on u64"):
        load_onnx(m)


def test_onnx_operator_without_unsigned_ir_op_is_refused_cleanly() -> None:
    """An ONNX operator whose IR op does not take u32 (Abs -> abs) is an UnsupportedOnnxError
    naming the node's operator and dtype, not a DTypeError from the graph builder."""
    from onnx import TensorProto, helper

    from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx

    m = _model([helper.make_node("Abs", ["a"], ["y"])], [("a", TensorProto.UINT32, (3,))],
               [("y", TensorProto.UINT32)])
    with pytest.raises(UnsupportedOnnxError, match="Abs on u32") as e:
        load_onnx(m)
    assert "Abs" in str(e.value) and "cast" in str(e.value)
