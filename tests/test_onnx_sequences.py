"""ONNX sequence values (``rlx_core.frontends.onnx_seq``): small ``onnx.helper`` models run through
staged execution / the ONNX backend adapter on rlx-cpu and compared with ``onnx.reference`` (lengths,
shapes, dtypes and numbers of every element), sequence graph inputs fed with several lengths into one
loaded model, sequence outputs as lists, and refusals that name the node and the fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx, load_onnx_model  # noqa: E402
from rlx_core.frontends.onnx_backend import RLXBackend  # noqa: E402
from rlx_core.frontends.onnx_seq import SequenceInputError  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes: list, inputs: list, outputs: list, opset: int = 17, check: bool = True) -> Any:
    g = helper.make_graph(nodes, "m", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if check:
        onnx.checker.check_model(m)
    return m


def _seq_in(name: str, elem: int = F32) -> Any:
    return helper.make_tensor_sequence_value_info(name, elem, None)


def _t(name: str, elem: int = F32, shape: Any = None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _check(got: Any, want: Any) -> None:
    """Exactly what onnx's runner should check (it does not compare a sequence's length)."""
    if isinstance(want, list):
        assert isinstance(got, list), f"expected a list, got {type(got).__name__}"
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w)
        return
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _run_both(m: Any, feed: dict[str, Any], sm: Any = None, oracle: str = "reference") -> Any:
    sm = sm or load_onnx_model(m, device="cpu")
    got = sm.run(feed)
    if oracle == "ort":
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feed)
    else:
        want = ReferenceEvaluator(m).run(None, feed)
    for name, w in zip(sm.output_names, want):
        _check(got[name], w)
    return sm


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_sequence_input_two_lengths_one_loaded_model() -> None:
    """One loaded model fed sequences of 3 and 1 elements (and other element shapes): one compiled
    variant per signature, the results on the backend, and the same signature again reuses it."""
    m = _model([helper.make_node("SequenceMap", ["s", "b"], ["y"],
                                 body=helper.make_graph([helper.make_node("Mul", ["e", "bb"], ["o"])], "body",
                                                        [_t("e"), _t("bb")], [_t("o")])),
                helper.make_node("SequenceLength", ["s"], ["n"])],
               [_seq_in("s"), _t("b", F32, [4])], [_seq_in("y"), _t("n", I64, [])])
    r = _rng()
    b = r.standard_normal(4).astype(np.float32)
    sm = load_onnx_model(m, device="cpu")
    three = [r.standard_normal((2, 4)).astype(np.float32) for _ in range(3)]
    _run_both(m, {"s": three, "b": b}, sm)
    assert sm.last_origins["y"] == "backend"
    _run_both(m, {"s": [r.standard_normal((5, 4)).astype(np.float32)], "b": b}, sm)
    assert sm.compiles == 2
    _run_both(m, {"s": [x + 1 for x in three], "b": b}, sm)
    assert sm.compiles == 2  # same length and element shapes: no recompile
    assert "shape-specialised" in sm.describe()


def test_empty_sequence_input_and_insert_positions() -> None:
    """SequenceInsert at the back, the front (negative) and a position fed at run time (value-keyed),
    starting from an empty fed sequence; SequenceErase and SequenceAt with negative positions."""
    nodes = [helper.make_node("SequenceInsert", ["s", "x"], ["s1"]),
             helper.make_node("SequenceInsert", ["s1", "x2", "front"], ["s2"]),
             helper.make_node("SequenceInsert", ["s2", "x", "p"], ["s3"]),
             helper.make_node("SequenceErase", ["s3", "last"], ["s4"]),
             helper.make_node("SequenceAt", ["s4", "last"], ["at"]),
             helper.make_node("Constant", [], ["front"], value=helper.make_tensor("f", I64, [], [-1])),
             helper.make_node("Constant", [], ["last"], value=helper.make_tensor("l", I64, [], [-1]))]
    nodes = nodes[-2:] + nodes[:-2]
    m = _model(nodes, [_seq_in("s"), _t("x", F32, [3]), _t("x2", F32, [3]), _t("p", I64, [])],
               [_seq_in("s4"), _t("at", F32, [3])])
    r = _rng(1)
    x, x2 = r.standard_normal(3).astype(np.float32), r.standard_normal(3).astype(np.float32)
    sm = _run_both(m, {"s": [], "x": x, "x2": x2, "p": np.array(1)})
    _run_both(m, {"s": [x2 * 3], "x": x, "x2": x2, "p": np.array(0)}, sm)
    _run_both(m, {"s": [x2 * 3, x * 2], "x": x, "x2": x2, "p": np.array(-2)}, sm)


def test_split_and_concat_from_sequence() -> None:
    """SplitToSequence (no split: keepdims 0/1; a scalar split with a remainder; 1-D sizes) and
    ConcatFromSequence (concat, and stack with new_axis=1) on a run-time tensor."""
    split_sizes = helper.make_tensor("sz", I64, [3], [1, 3, 3])
    split_scalar = helper.make_tensor("sc", I64, [], [3])
    nodes = [helper.make_node("Constant", [], ["sizes"], value=split_sizes),
             helper.make_node("Constant", [], ["scalar"], value=split_scalar),
             helper.make_node("SplitToSequence", ["x"], ["a"], axis=1, keepdims=0),
             helper.make_node("SplitToSequence", ["x"], ["b"], axis=-1),
             helper.make_node("SplitToSequence", ["x", "scalar"], ["c"], axis=1),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["d"], axis=1),
             helper.make_node("ConcatFromSequence", ["d"], ["cat"], axis=-1),
             helper.make_node("ConcatFromSequence", ["a"], ["stk"], axis=0, new_axis=1)]
    m = _model(nodes, [_t("x", F32, [2, 7])],
               [_seq_in("a"), _seq_in("b"), _seq_in("c"), _seq_in("d"), _t("cat", F32, None),
                _t("stk", F32, None)], check=False)
    x = _rng(2).standard_normal((2, 7)).astype(np.float32)
    _run_both(m, {"x": x})
    # The ONNX backend adapter (one plain graph: no sequence input) returns the lists too.
    rep = RLXBackend.prepare(m, "CPU", rlx_device="cpu", use_cache=False)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    for g, w in zip(rep.run([x]), want):
        _check(g, w)
    # load_onnx's graph: a sequence output is one RLX output per element.
    graph = load_onnx(m)
    assert [o for o in graph.outputs if o.startswith("c[")] == ["c[0]", "c[1]", "c[2]"]


def test_if_over_sequences_is_predicated_on_the_backend() -> None:
    """A run-time condition choosing between two sequences of equal length and element shapes: both
    branches are translated and each element selected with where (no value-keyed staging)."""
    def branch(name: str, op: str) -> Any:
        return helper.make_graph([helper.make_node(op, ["x", "x"], [f"{name}_v"]),
                                  helper.make_node("SequenceConstruct", [f"{name}_v", "x"], [f"{name}_s"])],
                                 name, [], [helper.make_tensor_sequence_value_info(f"{name}_s", F32, None)])
    m = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Add"),
                                 else_branch=branch("e", "Mul"))],
               [_t("c", TensorProto.BOOL, []), _t("x", F32, [3])], [_seq_in("y")], opset=13)
    x = _rng(3).standard_normal(3).astype(np.float32)
    sm = load_onnx_model(m, device="cpu")
    assert not sm.staged  # one graph: the condition is an input of where, not a compile-time key
    for c in (True, False):
        _run_both(m, {"c": np.array(c), "x": x}, sm)
    assert sm.compiles == 1 and sm.last_origins == {"y": "backend"}


def test_loop_carrying_a_sequence_from_a_fed_one() -> None:
    """Loop (trip count fed at run time: value-keyed) appending to a fed sequence; SequenceAt inside
    the body reads an outer sequence with the iteration number. Checked against ONNX Runtime: onnx
    1.x's reference evaluator returns the initial sequence unchanged for this Loop (no condition
    input), which ONNX's Loop semantics and ONNX Runtime contradict."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"]),
         helper.make_node("SequenceAt", ["outer", "i"], ["e"]),
         helper.make_node("Mul", ["e", "w"], ["v"]),
         helper.make_node("SequenceInsert", ["sin", "v"], ["sout"])],
        "body", [_t("i", I64, []), _t("cin", TensorProto.BOOL, []), _seq_in("sin")],
        [_t("cout", TensorProto.BOOL, []), _seq_in("sout")])
    m = _model([helper.make_node("Loop", ["n", "", "acc"], ["res"], body=body)],
               [_t("n", I64, []), _seq_in("acc"), _seq_in("outer"), _t("w", F32, [2])], [_seq_in("res")])
    r = _rng(4)
    outer = [r.standard_normal(2).astype(np.float32) for _ in range(3)]
    w = r.standard_normal(2).astype(np.float32)
    sm = _run_both(m, {"n": np.array(3), "acc": [w], "outer": outer, "w": w}, oracle="ort")
    _run_both(m, {"n": np.array(2), "acc": [], "outer": outer, "w": w}, sm, oracle="ort")
    assert sm.last_origins["res"] == "backend"


def test_optional_sequence_input_fed_present() -> None:
    """An optional(seq) graph input (test_loop16_seq_none's shape) fed present is bound like a
    sequence; fed empty (None) it is refused by name."""
    then_g = helper.make_graph([helper.make_node("SequenceEmpty", [], ["fresh"])], "then", [],
                               [_seq_in("fresh")])
    else_g = helper.make_graph([helper.make_node("OptionalGetElement", ["o"], ["got"])], "else", [],
                               [_seq_in("got")])
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F32, None))
    m = _model([helper.make_node("OptionalHasElement", ["o"], ["has"]),
                helper.make_node("Not", ["has"], ["none"]),
                helper.make_node("If", ["none"], ["s"], then_branch=then_g, else_branch=else_g),
                helper.make_node("SequenceInsert", ["s", "x"], ["y"])],
               [helper.make_value_info("o", helper.make_optional_type_proto(seq_t)), _t("x", F32, [2])],
               [_seq_in("y")], opset=16)
    x = np.array([1.0, 2.0], np.float32)
    sm = _run_both(m, {"o": [np.float32(5.0) * x], "x": x})
    with pytest.raises(UnsupportedOnnxError, match="optional sequence fed empty"):
        sm.run({"o": None, "x": x})


def test_sequence_input_refused_by_load_onnx_with_the_fix() -> None:
    m = _model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], [_seq_in("s")], [_t("y")],
               check=False)
    with pytest.raises(SequenceInputError) as e:
        load_onnx(m)
    assert "graph input 's' is a sequence" in e.value.what and "load_onnx_model" in (e.value.fix or "")


def test_data_dependent_sequence_length_is_refused() -> None:
    """A Loop whose exit depends on the data builds a sequence of data-dependent length: refused at
    load, naming the Loop and the fix (never approximated)."""
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["tot"], keepdims=0),
         helper.make_node("Cast", ["i"], ["fi"], to=F32),
         helper.make_node("Less", ["fi", "tot"], ["cout"]),
         helper.make_node("SequenceInsert", ["sin", "x"], ["sout"])],
        "body", [_t("i", I64, []), _t("cin", TensorProto.BOOL, []), _seq_in("sin")],
        [_t("cout", TensorProto.BOOL, []), _seq_in("sout")])
    m = _model([helper.make_node("SequenceEmpty", [], ["e"]),
                helper.make_node("Loop", ["", "c", "e"], ["res"], body=body)],
               [_t("x", F32, [3]), _t("c", TensorProto.BOOL, [])], [_seq_in("res")], opset=13)
    with pytest.raises(UnsupportedOnnxError) as e:
        load_onnx_model(m, device="cpu").run({"x": np.ones(3, np.float32), "c": np.array(True)})
    msg = str(e.value)
    assert "Loop" in msg and "condition" in msg and "run time" in msg


def test_a_sequence_used_as_a_tensor_is_refused_by_name() -> None:
    m = _model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
                helper.make_node("Relu", ["s"], ["y"])], [_t("x", F32, [2])], [_t("y")],
               check=False)  # onnx's checker rejects a sequence into Relu: the importer must too
    with pytest.raises(UnsupportedOnnxError, match=r"sequence value .* used where a tensor is needed") as e:
        load_onnx(m)
    assert "Relu" in str(e.value)


def test_run_time_split_sizes_are_value_keyed() -> None:
    m = _model([helper.make_node("SplitToSequence", ["x", "sp"], ["s"], axis=0),
                helper.make_node("SequenceLength", ["s"], ["n"])],
               [_t("x", F32, [6]), _t("sp", I64, [None])], [_seq_in("s"), _t("n", I64, [])], check=False)
    x = np.arange(6, dtype=np.float32)
    sm = _run_both(m, {"x": x, "sp": np.array([2, 4])})
    _run_both(m, {"x": x, "sp": np.array([1, 1, 4])}, sm)
    assert sm.compiles >= 2 and sm.last_origins["s"] == "backend"


def test_empty_sequence_outputs() -> None:
    """An empty sequence output is the empty list (computed at import: "host"); a model whose every
    output is empty would compute nothing on the backend and is refused saying so."""
    nodes = [helper.make_node("SequenceConstruct", ["x"], ["s"]),
             helper.make_node("SequenceErase", ["s"], ["e"]),
             helper.make_node("Relu", ["x"], ["r"])]
    m = _model(nodes, [_t("x", F32, [2])], [_seq_in("e"), _t("r", F32, [2])])
    sm = _run_both(m, {"x": np.array([1.0, -1.0], np.float32)})
    assert sm.last_origins == {"e": "host", "r": "backend"}
    m = _model(nodes[:2], [_t("x", F32, [2])], [_seq_in("e")])
    with pytest.raises(UnsupportedOnnxError, match="every graph output is an empty sequence"):
        load_onnx_model(m, device="cpu")
