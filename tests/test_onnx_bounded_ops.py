"""NonZero and NonMaxSuppression as bounded ops (rlx_core.ir.ops.bounded): the float32-exact references
against onnx.reference, rlx-cpu's kernels against the references, and staged execution running them on
the backend (trimmed at the cut) where the backend claims them, on the host where it does not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rlx_core.dtypes import DType
from rlx_core.errors import DispatchError
from rlx_core.frontends.onnx import DataDependentShapeError, UnsupportedOnnxError, load_onnx
from rlx_core.frontends.onnx_staged import load_onnx_model
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.ops.bounded import nms_reference, nonzero_reference
from rlx_core.runtime import Session

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _vi(name: str, t: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes: list, ins: list, outs: list, inits: tuple = (), opset: int = 13) -> Any:
    g = helper.make_graph(nodes, "m", ins, outs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _onnx_nms(boxes: np.ndarray, scores: np.ndarray, m: int, iou: float, sth: float | None,
              center: int) -> np.ndarray:
    names = ["b", "s", "m", "i"] + (["t"] if sth is not None else [])
    node = helper.make_node("NonMaxSuppression", names, ["o"], center_point_box=center)
    types: dict[str, int] = {"b": F32, "s": F32, "m": I64, "i": F32, "t": F32}
    md = _model([node], [_vi(n, types[n], None) for n in names], [_vi("o", I64, None)], opset=11)
    feed = {"b": boxes, "s": scores, "m": np.array([m], np.int64), "i": np.array([iou], np.float32)}
    if sth is not None:
        feed["t"] = np.array([sth], np.float32)
    res: Any = ReferenceEvaluator(md).run(None, feed)
    return np.asarray(res[0])


def _nms_graph(b: int, n: int, c: int, m: int, center: int, has: bool) -> Any:
    g = GraphBuilder("nms")
    ins = [g.input("b", DType.F32, (b, n, 4)), g.input("s", DType.F32, (b, c, n)),
           g.input("i", DType.F32, ()), g.input("t", DType.F32, ())]
    sel, cnt = g.op("non_max_suppression", *ins, max_output_boxes_per_class=m, center_point_box=center,
                    has_score_threshold=has)
    g.output(sel, "sel")
    g.output(cnt, "cnt")
    return g.build()


def test_nms_matches_onnx_reference_and_the_cpu_kernel_matches_it() -> None:
    """Grid boxes and quarter-step scores: ties in score and IoUs exactly on the threshold."""
    rng = np.random.default_rng(0)
    sess = Session("cpu")
    boundary_hits = 0
    for trial in range(160):
        b, c, n = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(0, 12))
        center = int(rng.integers(0, 2))
        boxes = (rng.integers(0, 5, size=(b, n, 4)) * 0.5).astype(np.float32) if trial % 2 else \
            rng.standard_normal((b, n, 4)).astype(np.float32)
        scores = (rng.integers(0, 4, size=(b, c, n)) / 4).astype(np.float32)
        m = int(rng.integers(0, 6))
        iou = float(rng.choice([0.0, 0.5, 1 / 3, 0.25, 1.0]))
        sth = None if trial % 3 else float(rng.choice([0.0, 0.25, 0.5]))
        want = _onnx_nms(boxes, scores, m, iou, sth, center)
        ref, cnt = nms_reference(boxes, scores, np.float32(iou), np.float32(sth or 0), m, center,
                                 sth is not None)
        k = int(cnt)
        np.testing.assert_array_equal(ref[:k], want)
        assert (ref[k:] == -1).all() and ref.shape == (b * c * min(n, m), 3)
        out = sess.compile(_nms_graph(b, n, c, m, center, sth is not None)).run(
            {"b": boxes, "s": scores, "i": np.float32(iou), "t": np.float32(sth or 0)})
        np.testing.assert_array_equal(out["sel"], ref)
        assert int(out["cnt"]) == k
        boundary_hits += int(iou in (0.5, 0.25) and trial % 2 == 1 and k > 0)
    assert boundary_hits > 10


def test_nms_iou_exactly_at_the_threshold_is_kept() -> None:
    # IoU of these two boxes is exactly 1/3 in float32: ONNX suppresses only above the threshold.
    boxes = np.array([[[0, 0, 1, 2], [0, 1, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8]]], np.float32)
    for thr, kept in ((np.float32(1 / 3), 2), (np.float32(0.3), 1)):
        sel, cnt = nms_reference(boxes, scores, thr, np.float32(0), 2, 0, False)
        assert int(cnt) == kept == len(_onnx_nms(boxes, scores, 2, float(thr), None, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 0, 3), (2, 3, 4)])
def test_nonzero_matches_onnx_reference_and_the_cpu_kernel(dtype: Any, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    vals = np.array([0.0, -0.0, np.nan, 1.5, -2.0]) if np.dtype(dtype).kind == "f" else np.array([0, 0, 1, 3])
    x = rng.choice(vals, size=shape).astype(dtype)
    tt: int = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    md = _model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", tt, None)], [_vi("y", I64, None)])
    res: Any = ReferenceEvaluator(md).run(None, {"x": x})
    want = np.asarray(res[0])
    idx, cnt = nonzero_reference(x)
    np.testing.assert_array_equal(idx[:, :int(cnt)], want)
    g = GraphBuilder("nz")
    a, k = g.op("nonzero", g.input("x", DType.parse(np.dtype(dtype)), shape))
    g.output(a, "a")
    g.output(k, "k")
    out = Session("cpu").compile(g.build()).run({"x": x})
    np.testing.assert_array_equal(out["a"], idx)
    assert int(out["k"]) == int(cnt)


def test_a_backend_without_the_claim_refuses_at_dispatch() -> None:
    g = GraphBuilder("nz")
    a, k = g.op("nonzero", g.input("x", DType.F32, (3,)))
    g.output(a, "a")
    g.output(k, "k")
    with pytest.raises(DispatchError) as ei:
        Session("whole").compile(g.build())
    assert "nonzero" in str(ei.value)


def _nonzero_chain() -> Any:
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]),
             helper.make_node("NonZero", ["m"], ["nz"], name="nz_node"),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["vals"]),
             helper.make_node("Mul", ["vals", "vals"], ["y"])]
    return _model(nodes, [_vi("x", F32, [3, 4])], [_vi("y", F32, None), _vi("nz", I64, None)],
                  inits=(numpy_helper.from_array(np.array(0, np.float32), "zero"),))


def _check(m: Any, sm: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    got = sm.run(feed)
    want = ReferenceEvaluator(m).run(None, feed)
    for name, w in zip([o.name for o in m.graph.output], want):
        np.testing.assert_array_equal(got[name], w)  # integer indices and products of the same floats
    return got


def test_staged_nonzero_runs_on_the_backend_and_is_trimmed_at_the_cut() -> None:
    m = _nonzero_chain()
    sm = load_onnx_model(m, device="cpu", host_ops=False)  # no host op: the backend computes it
    x = np.array([[1, -1, 2, 0], [0, 3, -4, 5], [-1, -1, -1, 6]], np.float32)
    _check(m, sm, {"x": x})
    assert sm.root.kind == "bounded" and sm.last_origins == {"y": "backend", "nz": "backend"}
    s1 = sm.root.stage1
    assert s1 is not None and s1.kind == "graph" and any(nd.op == "nonzero" for nd in s1.graph.nodes)
    n = sm.compiles
    _check(m, sm, {"x": x * 3})  # same count: the next stage is not compiled again
    assert sm.compiles == n
    x2 = x.copy()
    x2[0, 3] = 1
    _check(m, sm, {"x": x2})     # one more: a new shape, compiled once
    assert sm.compiles == n + 1
    text = sm.describe()
    assert "bounded op NonZero node 'nz_node' runs on cpu:0" in text and "host-evaluated" not in text
    assert "bounded op(s) on cpu:0 (trimmed at the cut): NonZero 'nz_node'" in text


def test_without_the_claim_it_stays_a_host_op() -> None:
    m = _model([helper.make_node("NonZero", ["x"], ["nz"], name="nz_node")], [_vi("x", F32, [5])],
               [_vi("nz", I64, None)])
    x = np.array([0, 1, 0, 2, 3], np.float32)
    sm = load_onnx_model(m, device="whole")
    _check(m, sm, {"x": x})
    assert sm.root.kind == "host" and sm.last_origins == {"nz": "host"}
    assert "host-evaluated op(s): NonZero 'nz_node'" in sm.describe()
    with pytest.raises(UnsupportedOnnxError, match="host_ops=True"):
        load_onnx_model(m, device="whole", host_ops=False)
    sm = load_onnx_model(m, device="cpu", bounded_ops=False)  # the caller's choice, on a claiming backend
    _check(m, sm, {"x": x})
    assert sm.root.kind == "host"


def test_plain_load_onnx_still_names_the_data_dependent_node() -> None:
    with pytest.raises(DataDependentShapeError) as e:
        load_onnx(_nonzero_chain())
    assert e.value.node == "nz_node" and type(e.value) is DataDependentShapeError


def _nms_model(k_input: bool, score_threshold: bool = True, center: int = 0) -> Any:
    ins = ["b", "s2", "k" if k_input else "kc", "iou"] + (["sth"] if score_threshold else [])
    nodes = [helper.make_node("Sigmoid", ["s"], ["s2"]),
             helper.make_node("NonMaxSuppression", ins, ["sel"], name="nms", center_point_box=center),
             helper.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
             helper.make_node("Gather", ["b", "box_idx"], ["picked"], axis=1)]
    inputs = [_vi("b", F32, [1, 6, 4]), _vi("s", F32, [1, 2, 6])] + ([_vi("k", I64, [1])] if k_input else [])
    inits = (numpy_helper.from_array(np.array([3], np.int64), "kc"),
             numpy_helper.from_array(np.array([0.4], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.3], np.float32), "sth"),
             numpy_helper.from_array(np.array(2, np.int64), "two"))
    return _model(nodes, inputs, [_vi("picked", F32, None), _vi("sel", I64, None)], inits=inits, opset=11)


def _boxes(rng: np.random.Generator) -> np.ndarray:
    return (rng.integers(0, 6, size=(1, 6, 4)) * 0.5).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
def test_staged_nms_runs_on_the_backend(center: int) -> None:
    rng = np.random.default_rng(2)
    m = _nms_model(False, center=center)
    sm = load_onnx_model(m, device="cpu", host_ops=False)
    for _ in range(4):
        feed = {"b": _boxes(rng), "s": rng.standard_normal((1, 2, 6)).astype(np.float32)}
        _check(m, sm, feed)
        assert sm.last_origins == {"picked": "backend", "sel": "backend"}
    assert "bounded op NonMaxSuppression node 'nms'" in sm.describe()


def test_staged_nms_with_a_run_time_limit_is_value_keyed() -> None:
    rng = np.random.default_rng(3)
    m = _nms_model(True, score_threshold=False)
    sm = load_onnx_model(m, device="cpu", host_ops=False)
    for k in (2, 5, 0):
        feed = {"b": _boxes(rng), "s": rng.standard_normal((1, 2, 6)).astype(np.float32),
                "k": np.array([k], np.int64)}
        got = _check(m, sm, feed)
        assert got["sel"].shape[0] <= 2 * k
        assert sm.last_origins["sel"] == "backend"
    assert sm.root.kind == "values" and sm.root.needed == ("k",)


def test_nms_matches_onnx_runtime() -> None:
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(4)
    m = _nms_model(False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sm = load_onnx_model(m, device="cpu")
    for _ in range(5):
        feed = {"b": _boxes(rng), "s": rng.standard_normal((1, 2, 6)).astype(np.float32)}
        want = sess.run(None, feed)
        got = sm.run(feed)
        np.testing.assert_array_equal(got["sel"], want[1])
        np.testing.assert_array_equal(got["picked"], want[0])


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_with_a_run_time_condition_runs_on_the_backend(axis: int | None) -> None:
    kw: dict[str, Any] = {} if axis is None else {"axis": axis}
    n = 12 if axis is None else (3 if axis == 0 else 4)
    m = _model([helper.make_node("Greater", ["c0", "zero"], ["c"]),
                helper.make_node("Compress", ["x", "c"], ["y"], name="cmp", **kw),
                helper.make_node("Neg", ["y"], ["z"])],
               [_vi("x", F32, [3, 4]), _vi("c0", F32, [n - 1])], [_vi("z", F32, None), _vi("y", F32, None)],
               inits=(numpy_helper.from_array(np.array(0, np.float32), "zero"),))
    sm = load_onnx_model(m, device="cpu", host_ops=False)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for c0 in (rng.standard_normal(n - 1), np.zeros(n - 1), np.ones(n - 1)):  # a shorter condition too
        _check(m, sm, {"x": x, "c0": c0.astype(np.float32)})
        assert sm.last_origins == {"z": "backend", "y": "backend"}
    assert sm.root.kind == "bounded" and "bounded op Compress node 'cmp'" in sm.describe()


def test_compress_condition_longer_than_the_axis_stays_a_host_op() -> None:
    m = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=0)],
               [_vi("x", F32, [2, 3]), _vi("c", TensorProto.BOOL, [3])], [_vi("y", F32, None)])
    sm = load_onnx_model(m, device="cpu")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _check(m, sm, {"x": x, "c": np.array([True, False, False])})
    assert sm.root.kind == "host"
