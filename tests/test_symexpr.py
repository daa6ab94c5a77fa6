"""Symbolic dimension expressions (issue 17): parser, canonical form, graphs, binding, files, ONNX."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.dtypes import DType
from rlx_core.errors import InputError, IRError, ShapeError
from rlx_core.ir import serialize, symexpr
from rlx_core.ir.reference import evaluate
from rlx_core.ir.types import TensorType, broadcast_shapes, check_dim


@pytest.mark.parametrize("text,canon", [
    ("batch*seq", "batch*seq"), ("seq*batch", "batch*seq"), ("batch * 4", "4*batch"),
    ("seq+past", "past+seq"), ("-1 + seq", "seq-1"), ("2*a*a+b-3", "2*a*a+b-3"),
    ("a*b+b*a", "2*a*b"), ("a-a", 0), ("3*2", 6), ("a*0+5", 5), ("x", "x"),
])
def test_canonical_form(text: str, canon: object) -> None:
    assert symexpr.canonical(text) == canon
    if isinstance(canon, str):  # canonical strings are fixed points of the parser
        assert symexpr.canonical(canon) == canon


@pytest.mark.parametrize("bad", ["a**b", "a+", "(a)", "1.5*a", "a b", "", "a/2", "__import__('os')"])
def test_parser_rejects_anything_else(bad: str) -> None:
    with pytest.raises(ShapeError, match="invalid dimension expression"):
        symexpr.canonical(bad)


def test_arithmetic_and_evaluation() -> None:
    assert symexpr.mul("batch", "seq") == "batch*seq"
    assert symexpr.add("seq", "past") == "past+seq"
    assert symexpr.sub("past+seq", "past") == "seq"
    assert symexpr.div_exact("4*batch*seq", "batch") == "4*seq"
    assert symexpr.div_exact("4*batch", 3) is None and symexpr.div_exact("batch+1", "batch") is None
    assert symexpr.div_exact(symexpr.mul("a+b", 2), 2) == "a+b"
    assert symexpr.evaluate("batch*seq+1", {"batch": 2, "seq": 3}) == 7
    assert symexpr.substitute("a*b+c", {"a": 2}) == "2*b+c"
    assert symexpr.symbols("a*b+c") == {"a", "b", "c"}
    with pytest.raises(ShapeError, match="needs the size of 'seq'"):
        symexpr.evaluate("batch*seq", {"batch": 2})


def test_tensor_types_hold_expressions() -> None:
    t = TensorType(DType.F32, ("seq*batch", 4))
    assert t.shape == ("batch*seq", 4) and t.symbols == {"batch", "seq"} and not t.is_static
    assert t.specialize({"batch": 2, "seq": 3}).shape == (6, 4)
    assert t.numel({"batch": 2, "seq": 5}) == 40
    assert check_dim("2*a-a", "here") == "a"
    with pytest.raises(ShapeError, match="negative for every size"):
        check_dim("-a", "here")
    with pytest.raises(ShapeError, match="invalid dimension"):
        TensorType(DType.F32, ("batch+",))


def test_broadcast_with_one_and_equal_expression() -> None:
    assert broadcast_shapes(("batch*seq", 4), (1, 4)) == ("batch*seq", 4)
    assert broadcast_shapes(("seq*batch", 1), ("batch*seq", 3)) == ("batch*seq", 3)
    with pytest.raises(ShapeError, match="do not broadcast"):
        broadcast_shapes(("batch*seq",), ("batch",))


def _flatten_concat_graph() -> GraphBuilder:
    g = GraphBuilder("sym")
    x = g.input("x", "f32", ("batch", "seq", 4))
    p = g.input("p", "f32", ("batch", "past", 4))
    c = g.op("concat", p, x, axis=1)                            # (batch, past+seq, 4)
    f = g.op("reshape", c, shape=(-1, 4))                       # (batch*past+batch*seq, 4)
    g.output(g.op("relu", f), "y")
    return g


def test_graph_inference_specialize_and_run() -> None:
    graph = _flatten_concat_graph().build()
    assert graph.types["y"].shape == ("batch*past+batch*seq", 4)
    assert graph.symbols == {"batch", "past", "seq"}
    assert graph.specialize({"batch": 2, "past": 3, "seq": 1}).types["y"].shape == (8, 4)
    exe = Session("cpu", use_cache=False).compile(graph)
    rng = np.random.default_rng(0)
    for b, past, seq in ((2, 3, 1), (1, 0, 5)):
        x = rng.standard_normal((b, seq, 4)).astype(np.float32)
        p = rng.standard_normal((b, past, 4)).astype(np.float32)
        want = np.maximum(np.concatenate([p, x], 1).reshape(-1, 4), 0)
        np.testing.assert_array_equal(exe.run(x=x, p=p)["y"], want)
        np.testing.assert_array_equal(evaluate(graph, {"x": x, "p": p})["y"], want)


def test_reshape_minus_one_must_be_a_polynomial() -> None:
    g = GraphBuilder("bad")
    x = g.input("x", "f32", ("batch", 6))
    with pytest.raises(ShapeError, match="not a polynomial"):
        g.op("reshape", x, shape=(-1, 4))
    with pytest.raises(ShapeError, match="changes the element count"):
        g.op("reshape", x, shape=("batch", 3))
    assert g.op("reshape", x, shape=(-1, 3)).shape == ("2*batch", 3)


def test_input_expression_dims_are_checked_against_fed_shapes() -> None:
    g = GraphBuilder("inp")
    x = g.input("x", "f32", ("batch", "seq"))
    f = g.input("f", "f32", ("batch*seq",))
    g.output(g.op("add", g.op("reshape", x, shape=("batch*seq",)), f), "y")
    exe = Session("cpu", use_cache=False).compile(g.build())
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(exe.run(x=x, f=np.arange(6, dtype=np.float32))["y"], np.arange(6) + 1)
    with pytest.raises(InputError, match=r"input 'f'.*axis 0 is 5 but batch\*seq = 6"):
        exe.run(x=x, f=np.zeros(5, np.float32))


def test_input_expression_needs_each_symbol_bound_by_a_plain_dim() -> None:
    g = GraphBuilder("free")
    g.output(g.input("f", "f32", ("batch*seq",)), "y")
    with pytest.raises(IRError, match="no input has an axis that is just 'batch', 'seq'"):
        g.build()


def test_serialize_round_trip_and_fingerprint(tmp_path: Path) -> None:
    graph = _flatten_concat_graph().build()
    path = tmp_path / "sym.rlx"
    serialize.save(graph, path)
    back = serialize.load(path)
    assert back.types["y"].shape == graph.types["y"].shape
    assert back.structure() == graph.structure() and back.fingerprint == graph.fingerprint
    # the same polynomial spelt another way is the same graph
    g = GraphBuilder("sym")
    x = g.input("x", "f32", ("batch", "seq", 4))
    p = g.input("p", "f32", ("batch", "past", 4))
    c = g.op("concat", p, x, axis=1)
    f = g.op("reshape", c, shape=("seq*batch + past*batch", 4))
    g.output(g.op("relu", f), "y")
    other = g.build()
    assert other.nodes[1].attrs["shape"] == ("batch*past+batch*seq", 4)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")),
                    reason="needs onnx and onnxruntime (requirements/test.txt)")
def test_onnx_flatten_of_batch_and_seq_matches_onnxruntime() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from rlx_core.frontends.onnx import load_onnx

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=2), helper.make_node("MatMul", ["f", "w"], ["y"])]
    graph = helper.make_graph(nodes, "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            ["batch", "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4, 3], w.reshape(-1).tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    g = load_onnx(model)
    assert g.types["y"].shape == ("batch*seq", 3)
    exe = Session("cpu", use_cache=False).compile(g)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b, s in ((2, 3), (5, 1)):
        x = rng.standard_normal((b, s, 4)).astype(np.float32)
        np.testing.assert_allclose(exe.run(x=x)["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


# -- ONNX handlers over symbolic dims, each checked against ONNX Runtime at two bindings ----------

def _onnx_case(nodes: list, inputs: list, inits: dict, opset: int = 17) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    codes = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64}
    vis = [helper.make_tensor_value_info(n, codes[dt], shape) for n, dt, shape in inputs]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    tensors = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()]
    g = helper.make_graph(nodes, "case", vis, out, tensors)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _check_vs_ort(model: bytes, feeds: list[dict[str, np.ndarray]]) -> object:
    import onnxruntime as ort

    from rlx_core.frontends.onnx import load_onnx

    graph = load_onnx(model)
    exe = Session("cpu", use_cache=False).compile(graph)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = sess.run(None, feed)[0]
        got = exe.run(**feed)["y"]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return graph.types["y"].shape


def _shape_nodes(src: str, picks: dict[str, int]) -> list:
    """Shape(src) and one Gather per picked axis (name -> axis), each a 1-element vector."""
    from onnx import helper

    nodes = [helper.make_node("Shape", [src], [f"{src}_shape"])]
    for name, axis in picks.items():
        nodes.append(helper.make_node("Gather", [f"{src}_shape", f"ax{axis}"], [name], axis=0))
    return nodes


def _axes(*axes: int) -> dict[str, np.ndarray]:
    return {f"ax{a}": np.array([a], np.int64) for a in axes}


_ONNX = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")),
                           reason="needs onnx and onnxruntime (requirements/test.txt)")


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@_ONNX
def test_onnx_reshape_heads_times_batch_and_concat_past() -> None:
    from onnx import helper

    nodes = [
        helper.make_node("Concat", ["past", "x"], ["c"], axis=1),            # (batch, past+seq, 8)
        helper.make_node("Reshape", ["c", "t"], ["r"]),                        # (4*batch, past+seq, 2)
        *_shape_nodes("x", {"b": 0}),
        helper.make_node("Mul", ["b", "four"], ["b4"]),
        helper.make_node("Concat", ["b4", "m1", "two"], ["t2"], axis=0),
        helper.make_node("Reshape", ["r", "t2"], ["y"]),                       # (4*batch, -1, 2)
    ]
    inits = {"t": np.array([-1, 0, 2], np.int64), "four": np.array([4], np.int64),
             "m1": np.array([-1], np.int64), "two": np.array([2], np.int64), **_axes(0)}
    x = [("x", np.float32, ["batch", "seq", 8]), ("past", np.float32, ["batch", "past", 8])]
    m = _onnx_case(nodes, x, inits)
    feeds = [{"x": _rand(2, 3, 8), "past": _rand(2, 5, 8, seed=1)},
             {"x": _rand(1, 1, 8), "past": _rand(1, 2, 8, seed=2)}]
    assert _check_vs_ort(m, feeds) == ("4*batch", "past+seq", 2)


@_ONNX
def test_onnx_tile_and_range_over_symbolic_sizes() -> None:
    from onnx import helper

    nodes = [
        *_shape_nodes("x", {"b": 0, "s": 1}),
        helper.make_node("Concat", ["b", "one"], ["reps"], axis=0),
        helper.make_node("Tile", ["w", "reps"], ["tiled"]),                     # (2*batch, 3)
        helper.make_node("Squeeze", ["s", "ax0"], ["s0"]),
        helper.make_node("Range", ["start", "s0", "step"], ["pos"]),            # seq-1 positions 1..seq-1
        helper.make_node("Cast", ["pos"], ["posf"], to=1),
        helper.make_node("ReduceSum", ["posf"], ["tot"], keepdims=1),
        helper.make_node("Add", ["tiled", "tot"], ["y"]),
    ]
    inits = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "one": np.array([1], np.int64),
             "start": np.array(1, np.int64), "step": np.array(1, np.int64), **_axes(0, 1)}
    m = _onnx_case(nodes, [("x", np.float32, ["batch", "seq"])], inits)
    feeds = [{"x": _rand(3, 4)}, {"x": _rand(1, 6)}]
    assert _check_vs_ort(m, feeds) == ("2*batch", 3)


@_ONNX
def test_onnx_gather_nd_and_gather_elements_over_symbolic_axes() -> None:
    from onnx import helper

    nodes = [helper.make_node("GatherND", ["x", "i"], ["g"]),                 # (batch*seq) rows picked
             helper.make_node("GatherElements", ["g2", "j"], ["e"], axis=1),
             helper.make_node("ReduceSum", ["e"], ["es"], keepdims=0),
             helper.make_node("Add", ["g", "es"], ["y"])]
    x = [("x", np.float32, ["batch", "seq", 3]), ("i", np.int64, ["n", 2]),
         ("g2", np.float32, ["batch", 5]), ("j", np.int64, ["batch", "k"])]
    m = _onnx_case(nodes, x, {})
    rng = np.random.default_rng(3)
    feeds = []
    for b, s, n, k in ((2, 3, 4, 2), (3, 1, 2, 6)):
        i = np.stack([rng.integers(-b, b, n), rng.integers(-s, s, n)], 1).astype(np.int64)
        feeds.append({"x": _rand(b, s, 3), "i": i, "g2": _rand(b, 5, seed=4),
                      "j": rng.integers(-5, 5, (b, k)).astype(np.int64)})
    _check_vs_ort(m, feeds)


@_ONNX
def test_onnx_resize_sizes_from_the_symbolic_shape() -> None:
    from onnx import helper

    nodes = [*_shape_nodes("x", {"b": 0, "c": 1}),
             helper.make_node("Concat", ["b", "c", "hw"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")]
    inits = {"hw": np.array([6, 4], np.int64), **_axes(0, 1)}
    m = _onnx_case(nodes, [("x", np.float32, ["batch", 2, 3, 2])], inits, opset=13)
    feeds = [{"x": _rand(2, 2, 3, 2)}, {"x": _rand(1, 2, 3, 2, seed=5)}]
    assert _check_vs_ort(m, feeds) == ("batch", 2, 6, 4)


@_ONNX
def test_onnx_refusals_name_the_node_and_symbols() -> None:
    from onnx import helper

    from rlx_core.frontends.onnx import SymbolicShapeError, load_onnx

    # Resize to 2*H: the interpolation weights depend on H, so it is refused, not approximated.
    nodes = [*_shape_nodes("x", {"h": 2}), helper.make_node("Mul", ["h", "two"], ["h2"]),
             helper.make_node("Concat", ["one", "one", "h2", "w"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", name="up")]
    inits = {"two": np.array([2], np.int64), "one": np.array([1], np.int64), "w": np.array([4], np.int64),
             **_axes(2)}
    m = _onnx_case(nodes, [("x", np.float32, [1, 1, "H", 4])], inits, opset=13)
    with pytest.raises(SymbolicShapeError, match=r"would become 2\*H") as ei:
        load_onnx(m)
    assert "'up'" in (ei.value.where or "") and "symbols={'H': 2}" in (ei.value.fix or "")


def test_an_expression_that_goes_negative_is_an_error_not_a_minus_one() -> None:
    g = GraphBuilder("neg")
    x = g.input("x", "f32", ("seq",))
    g.output(g.op("reshape", g.op("iota", shape=("seq-1",), axis=0, dtype="f32"), shape=(1, "seq-1")), "y")
    g.output(x, "x_out")
    exe = Session("cpu", use_cache=False).compile(g.build())
    np.testing.assert_array_equal(exe.run(x=np.zeros(4, np.float32))["y"], [[0, 1, 2]])
    with pytest.raises(ShapeError, match="dimension seq-1 is -1 with seq=0"):
        exe.run(x=np.zeros(0, np.float32))


@_ONNX
def test_onnx_range_whose_length_can_be_negative_is_refused() -> None:
    from onnx import helper

    from rlx_core.frontends.onnx import SymbolicShapeError, load_onnx

    nodes = [*_shape_nodes("x", {"s": 0}), helper.make_node("Squeeze", ["s", "ax0"], ["s0"]),
             helper.make_node("Range", ["start", "s0", "step"], ["r"], name="pos"),
             helper.make_node("Cast", ["r"], ["y"], to=1)]
    inits = {"start": np.array(2, np.int64), "step": np.array(1, np.int64), **_axes(0)}
    m = _onnx_case(nodes, [("x", np.float32, ["seq"])], inits)
    with pytest.raises(SymbolicShapeError, match="length seq-2, which is negative") as ei:
        load_onnx(m)
    assert "'pos'" in (ei.value.where or "")


def test_slice_lengths_over_symbolic_dims() -> None:
    g = GraphBuilder("sl")
    x = g.input("x", "f32", ("batch", "seq"))
    tail = g.op("slice", x, starts=(1,), stops=(2**63 - 1,), axes=(1,))
    head = g.op("slice", x, starts=(0,), stops=(-1,), axes=(1,))
    assert tail.shape == head.shape == ("batch", "seq-1")
    g.output(g.op("sub", tail, head), "y")
    exe = Session("cpu", use_cache=False).compile(g.build())
    for b, s in ((2, 5), (3, 1), (1, 0)):  # seq=0: the slices are empty (re-inferred when bound)
        a = np.random.default_rng(s).standard_normal((b, s)).astype(np.float32)
        np.testing.assert_array_equal(exe.run(x=a)["y"], a[:, 1:] - a[:, :-1])
    with pytest.raises(ShapeError, match="slice of symbolic dim"):
        g.op("slice", x, starts=(0,), stops=(3,), axes=(1,))  # min(3, seq): not a polynomial
