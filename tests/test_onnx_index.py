"""ONNX indexing and integer operators (``rlx_core.frontends.onnx_index``, issue 17).

Each case is a one-node ``onnx.helper`` model run on rlx-cpu and compared with ONNX Runtime (or, where
ORT lacks the operator version, a NumPy reference): GatherElements, GatherND with batch_dims and
negative indices, ScatterElements/ScatterND (add), Trilu, OneHot, Compress, integer Mod, BitShift,
Einsum. Out-of-range indices must be an error, never a neighbouring element; what cannot be exact
(TopK, scatter reductions other than add) is refused naming the operator; float Mod is in onnx_ops2.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from _onnxtools import make_model, run_rlx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.errors import RLXError  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx  # noqa: E402

F32, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
I8, U8 = TensorProto.INT8, TensorProto.UINT8


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def model(node: Any, inputs: Sequence[tuple[str, int, Sequence[int]]], n_out: int = 1,
          inits: dict[str, np.ndarray] | None = None, opset: int = 18) -> Any:
    """A one-node model of ``node``'s first ``n_out`` outputs."""
    return make_model(node, inputs, list(node.output[:n_out]), inits, opset,
                      ir_version=8 if opset <= 18 else 11)


def check(m: Any, feeds: dict[str, np.ndarray], ref: list[np.ndarray] | None = None) -> None:
    """Equal to ONNX Runtime (or ``ref``) exactly for integers, to 1e-5 relative for floats."""
    if ref is None:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    for got, want in zip(run_rlx(m, feeds), ref):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


RNG = np.random.default_rng(17)
X34 = RNG.standard_normal((3, 4)).astype(np.float32)


# -- gathers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis,idx", [
    (0, [[0, 2, 1, -1], [-3, 1, 2, 0]]),
    (1, [[3, -4], [0, 1], [-1, 2]]),           # indices narrower than data off the axis
    (-1, [[0], [3], [-2]]),
])
def test_gather_elements(axis: int, idx: list[list[int]]) -> None:
    ind = np.array(idx, np.int64)
    m = model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis),
              [("x", F32, (3, 4)), ("i", I64, ind.shape)])
    check(m, {"x": X34, "i": ind})


def test_gather_elements_out_of_range_is_an_error_not_a_neighbour() -> None:
    """Row index 3 of a 3-row axis would land on the next column's element if linearised blindly."""
    m = model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0),
              [("x", F32, (3, 4)), ("i", I64, (1, 4))])
    with pytest.raises(RLXError, match="out of range"):
        run_rlx(m, {"x": X34, "i": np.array([[0, 3, 0, 0]], np.int64)})
    const = model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0), [("x", F32, (3, 4))],
                  inits={"i": np.array([[0, 7, 0, 0]], np.int64)})
    with pytest.raises(UnsupportedOnnxError, match="constant index 7"):
        load_onnx(const)


@pytest.mark.parametrize("batch_dims,xs,ind", [
    (0, (3, 4, 2), [[0, -1], [2, 1], [-3, 0]]),         # negative components of a 2-D index
    (1, (2, 3, 4), [[[1, -1]], [[-3, 2]]]),
    (2, (2, 3, 4), [[[1], [-1], [0]], [[3], [2], [0]]]),
])
def test_gather_nd(batch_dims: int, xs: tuple[int, ...], ind: list[Any]) -> None:
    i = np.array(ind, np.int64)
    m = model(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims),
              [("x", F32, xs), ("i", I64, i.shape)])
    check(m, {"x": RNG.standard_normal(xs).astype(np.float32), "i": i})


def test_gather_nd_out_of_range_component_is_an_error() -> None:
    m = model(helper.make_node("GatherND", ["x", "i"], ["y"]), [("x", F32, (3, 4)), ("i", I64, (1, 2))])
    with pytest.raises(RLXError, match="out of range"):
        run_rlx(m, {"x": X34, "i": np.array([[0, 4]], np.int64)})  # (0, 4) is not (1, 0)


# -- scatters ---------------------------------------------------------------------------------

def test_scatter_elements_add_and_scatter_nd_add() -> None:
    i = np.array([[1, 0, -1, 1], [1, 2, 2, 0]], np.int64)  # duplicates along axis 0
    u = RNG.standard_normal((2, 4)).astype(np.float32)
    m = model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction="add"),
              [("x", F32, (3, 4)), ("i", I64, (2, 4)), ("u", F32, (2, 4))])
    check(m, {"x": X34, "i": i, "u": u})
    nd = np.array([[2, 1], [0, -1], [2, 1]], np.int64)
    m = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add"),
              [("x", F32, (3, 4)), ("i", I64, (3, 2)), ("u", F32, (3,))])
    check(m, {"x": X34, "i": nd, "u": np.array([1.0, 2.0, 4.0], np.float32)})
    rows = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add"),
                 [("x", F32, (3, 4)), ("i", I64, (2, 1)), ("u", F32, (2, 4))])
    check(rows, {"x": X34, "i": np.array([[2], [2]], np.int64), "u": X34[:2]})


@pytest.mark.parametrize("red", ["none", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_reductions(red: str, axis: int) -> None:
    """Duplicates included: 'none' lets the last one win, as ONNX Runtime's sequential loop."""
    i = np.array([[1, 0, -1], [1, 2, 2], [0, 0, 1]], np.int64) if axis == 0 else \
        np.array([[3, 0, -1], [1, 1, 1], [0, 2, 2]], np.int64)
    u = RNG.standard_normal((3, 3)).astype(np.float32)
    m = model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=red),
              [("x", F32, (3, 4)), ("i", I64, (3, 3)), ("u", F32, (3, 3))])
    check(m, {"x": X34, "i": i, "u": u})


@pytest.mark.parametrize("red", ["none", "mul", "max", "min"])
def test_scatter_nd_reductions(red: str) -> None:
    i = np.array([[2, 1], [0, -1], [2, 1]], np.int64)
    m = model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=red),
              [("x", I32, (3, 4)), ("i", I64, (3, 2)), ("u", I32, (3,))])
    check(m, {"x": np.arange(12, dtype=np.int32).reshape(3, 4), "i": i, "u": np.array([5, -2, 7], np.int32)})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_kv_cache_write(mode: str) -> None:
    """TensorScatter-24 against the operator's own loop (circular: the write wraps around)."""
    cache = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    upd = RNG.standard_normal((2, 3, 2, 4)).astype(np.float32)
    wi = np.array([1, 4 if mode == "circular" else 3], np.int64)
    m = model(helper.make_node("TensorScatter", ["c", "u", "w"], ["y"], mode=mode),
              [("c", F32, cache.shape), ("u", F32, upd.shape), ("w", I64, (2,))], opset=24)
    ref = cache.copy()
    for b, h, s in np.ndindex(2, 3, 2):
        ref[b, h, (wi[b] + s) % 5 if mode == "circular" else wi[b] + s] = upd[b, h, s]
    check(m, {"c": cache, "u": upd, "w": wi}, [ref])


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [1, 0])
def test_topk(largest: int, axis: int) -> None:
    x = np.array([[3, 1, 3, 2, 1], [0, 0, 5, -1, 5], [2, 2, 2, 2, 2]], np.float32)  # ties: lower first
    k = 3 if axis == 1 else 2
    m = model(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest),
              [("x", F32, (3, 5))], n_out=2, inits={"k": np.array([k], np.int64)})
    check(m, {"x": x})


@pytest.mark.parametrize("op,attrs,inputs", [
    ("scatter_reduce", {"axis": 1, "reduction": "none"}, "scatter"),
    ("scatter_reduce", {"axis": 0, "reduction": "mul"}, "scatter"),
    ("scatter_reduce", {"axis": 1, "reduction": "max"}, "scatter"),
    ("scatter_reduce", {"axis": 0, "reduction": "min"}, "scatter"),
    ("topk_indices", {"k": 3, "axis": 1, "largest": True}, "topk"),
    ("topk_indices", {"k": 2, "axis": 0, "largest": False}, "topk"),
])
def test_portable_decompositions_match_the_references(op: str, attrs: dict[str, Any], inputs: str) -> None:
    """Backends without a native kernel run the core's dense decomposition: exactly the reference,
    NaN ordering and ties included, and an out-of-range index is still an error."""
    from rlx_core.dtypes import DType
    from rlx_core.errors import InputError
    from rlx_core.ir.builder import GraphBuilder
    from rlx_core.ir.reference import evaluate
    from rlx_core.ir.schema import REGISTRY

    feeds: dict[str, np.ndarray]
    if inputs == "scatter":
        feeds = {"x": X34, "i": np.array([[1, 0, -1], [1, 2, 2]], np.int64),
                 "u": RNG.standard_normal((2, 3)).astype(np.float32)}
    else:
        x = np.array([[1, np.nan, 1, 3, np.nan], [0, -0.0, 0, 2, -1], [4, 4, 4, 4, 4]], np.float32)
        feeds = {"x": x}

    def graph(decompose: bool) -> Any:
        g = GraphBuilder(op)
        ts = [g.input(n, DType.parse(a.dtype), a.shape) for n, a in feeds.items()]
        dec = REGISTRY.get(op).decompose
        assert dec is not None
        y = dec(g, ts, attrs)[0] if decompose else g.op(op, *ts, **attrs)
        g.output(y, "y")
        return g.build()

    ref, dec = evaluate(graph(False), feeds)["y"], evaluate(graph(True), feeds)["y"]
    if attrs.get("reduction") == "mul":  # (x * u1) * u2 in the reference, x * (u1 * u2) decomposed
        np.testing.assert_allclose(dec, ref, rtol=1e-6)
    else:
        np.testing.assert_array_equal(dec, ref)
    if inputs == "scatter":
        feeds["i"] = np.array([[1, 0, 4], [1, 2, 2]], np.int64) if attrs["axis"] == 1 else \
            np.array([[1, 0, 3], [1, 2, 2]], np.int64)
        with pytest.raises(InputError, match="out of range"):
            evaluate(graph(True), feeds)


# -- masks and selections ---------------------------------------------------------------------

@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2, 9])
def test_trilu(upper: int, k: int | None) -> None:
    ins, inits = ["x"], {}
    if k is not None:
        ins.append("k")
        inits["k"] = np.array(k, np.int64)
    m = model(helper.make_node("Trilu", ins, ["y"], upper=upper), [("x", F32, (2, 3, 5))], inits=inits)
    check(m, {"x": RNG.standard_normal((2, 3, 5)).astype(np.float32)})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis: int) -> None:
    m = model(helper.make_node("OneHot", ["i", "depth", "v"], ["y"], axis=axis), [("i", I64, (2, 3))],
              inits={"depth": np.array(5, np.int64), "v": np.array([-1.5, 3.0], np.float32)})
    check(m, {"i": np.array([[0, 4, -1], [-5, 7, -6]], np.int64)})  # 7 and -6: rows of off values


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress_with_constant_condition(axis: int | None) -> None:
    kw: dict[str, Any] = {} if axis is None else {"axis": axis}
    cond = np.array([True, False, True], bool) if axis != -1 else np.array([False, True, True, False])
    m = model(helper.make_node("Compress", ["x", "c"], ["y"], **kw), [("x", F32, (3, 4))], inits={"c": cond})
    check(m, {"x": X34})


# -- integer arithmetic -----------------------------------------------------------------------

@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dt,np_dt", [(I32, np.int32), (I64, np.int64), (I8, np.int8), (U8, np.uint8)])
def test_integer_mod(fmod: int, dt: int, np_dt: Any) -> None:
    info = np.iinfo(np_dt)
    # INT64_MIN is left out: rlx-cpu's i64 division goes through |a|, which overflows there.
    lo = info.min if np_dt is not np.int64 else info.min + 1
    if info.min == 0:
        a = np.array([7, 0, 5, info.max, 3, 200], np_dt)
        b = np.array([3, 4, 5, 7, info.max, 9], np_dt)
    else:
        a = np.array([7, -7, 7, -7, 0, 5, info.max, lo, 3, -5], np_dt)
        b = np.array([3, 3, -3, -3, 4, 5, 7, 3, info.max, lo], np_dt)
    m = model(helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod), [("a", dt, a.shape), ("b", dt, b.shape)])
    check(m, {"a": a, "b": b})


def test_float_mod_is_exact() -> None:
    """Float Mod runs on the exact ``mod`` op (rlx_core.frontends.onnx_ops2; tests/test_onnx_ops2.py)."""
    a = np.array([1e30, -7.5, 7.5, 5.0], np.float32)
    b = np.array([3.0, 2.0, -2.0, np.inf], np.float32)
    m = model(helper.make_node("Mod", ["a", "b"], ["y"], fmod=1), [("a", F32, (4,)), ("b", F32, (4,))])
    check(m, {"a": a, "b": b}, [np.fmod(a, b)])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_uint8(direction: str) -> None:
    x = np.array([1, 255, 128, 7, 200, 3], np.uint8)
    s = np.array([0, 1, 7, 8, 3, 255], np.uint8)
    m = model(helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction),
              [("x", U8, (6,)), ("s", U8, (6,))])
    ref = (x.astype(np.int64) << s.astype(np.int64)) & 0xFF if direction == "LEFT" else \
        np.where(s < 8, x.astype(np.int64) >> np.minimum(s, 63).astype(np.int64), 0)
    check(m, {"x": x, "s": s}, [ref.astype(np.uint8)])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dt,np_dt", [(I8, np.int8), (I32, np.int32)])
def test_bitshift_signed_opset28(direction: str, dt: int, np_dt: Any) -> None:
    """BitShift-28: arithmetic right shift; a shift outside [0, w) gives the sign fill alone."""
    w = np.iinfo(np_dt).bits
    x = np.array([1, -1, -128, 127, -7, 5, -3, 9, -100], np_dt)
    s = np.array([1, 3, w - 1, w - 1, 2, w, -1, 0, w + 5], np_dt)
    m = model(helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction),
              [("x", dt, (9,)), ("s", dt, (9,))], opset=28)
    xi, si = x.astype(np.int64), s.astype(np.int64)
    inside = (si >= 0) & (si < w)
    if direction == "LEFT":
        ref = np.where(inside, (xi << np.clip(si, 0, 63)) & ((1 << w) - 1), 0)
        ref = np.where(ref >= 1 << (w - 1), ref - (1 << w), ref)
    else:
        ref = np.where(inside, xi >> np.clip(si, 0, 63), np.where(xi < 0, -1, 0))
    check(m, {"x": x, "s": s}, [ref.astype(np_dt)])


# -- einsum -----------------------------------------------------------------------------------

@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),                      # implicit output: a scalar
    ("ij,kj", [(3, 4), (2, 4)]),                # implicit output: ik
    ("...ii->...i", [(2, 3, 3)]),               # a diagonal
    ("ii", [(4, 4)]),                           # the trace
    ("b...d,bkd->b...k", [(2, 3, 5, 4), (2, 6, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd->dba", [(2, 3, 4), (4, 5)]),
])
def test_einsum(eq: str, shapes: list[tuple[int, ...]]) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    m = model(helper.make_node("Einsum", names, ["y"], equation=eq),
              [(n, F32, s) for n, s in zip(names, shapes)])
    ref = np.einsum(eq, *[a.astype(np.float64) for a in arrays]).astype(np.float32)
    check(m, dict(zip(names, arrays)), [np.asarray(ref)])


def test_einsum_broadcasts_size_one_letters_and_refuses_mismatches() -> None:
    m = model(helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik"),
              [("a", F32, (3, 2, 4)), ("b", F32, (1, 4, 5))])
    a = RNG.standard_normal((3, 2, 4)).astype(np.float32)
    b = RNG.standard_normal((1, 4, 5)).astype(np.float32)
    check(m, {"a": a, "b": b}, [np.einsum("bij,bjk->bik", a, b)])
    bad = model(helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,ij->ij"),
                [("a", F32, (3, 4)), ("b", F32, (2, 4))])
    with pytest.raises(UnsupportedOnnxError, match="sizes 3 and 2"):
        load_onnx(bad)
