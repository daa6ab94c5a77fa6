"""Staged execution of ONNX models whose shapes depend on run-time values or data
(rlx_core.frontends.onnx_staged): every result is compared with onnx's reference evaluator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core.frontends.onnx import (  # noqa: E402
    DataDependentShapeError,
    RuntimeValueError,
    UnsupportedOnnxError,
    load_onnx,
    load_onnx_model,
)

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes: list[Any], ins: list[Any], outs: list[Any], opset: int = 13, inits: tuple = ()) -> Any:
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, initializer=list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, t: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, t, shape)


def _check(m: Any, sm: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    got = sm.run(feed)
    want = ReferenceEvaluator(m).run(None, feed)
    for name, w in zip(sm.output_names, want):
        assert got[name].dtype == np.asarray(w).dtype, name
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6, err_msg=name)
    return got


def _reduce_sum_model() -> Any:
    return _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="rs")],
                  [_vi("x", F32, [2, 3]), _vi("axes", I64, [1])], [_vi("y", F32, None)])


def test_plain_import_names_the_run_time_tensor_and_node() -> None:
    with pytest.raises(RuntimeValueError) as e:
        load_onnx(_reduce_sum_model())
    assert e.value.tensors == ("axes",) and e.value.node == "rs"
    assert "load_onnx_model" in (e.value.fix or "")


def test_run_time_axes_two_values_one_model_and_cache_hits() -> None:
    m = _reduce_sum_model()
    sm = load_onnx_model(m, device="cpu")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    _check(m, sm, {"x": a, "axes": np.array([0])})
    _check(m, sm, {"x": a, "axes": np.array([1])})
    assert sm.compiles == 2
    _check(m, sm, {"x": a * 3 - 1, "axes": np.array([0])})  # same value: no recompile
    _check(m, sm, {"x": a, "axes": np.array([-1])})
    assert sm.compiles == 3
    text = sm.describe()
    assert "value-keyed input(s) axes" in text and "'rs'" in text


def test_lru_bound_recompiles_evicted_values() -> None:
    m = _reduce_sum_model()
    sm = load_onnx_model(m, device="cpu", cache_size=1)
    a = np.ones((2, 3), np.float32)
    for ax in (0, 1, 0):
        _check(m, sm, {"x": a, "axes": np.array([ax])})
    assert sm.compiles == 3


def test_reshape_to_a_shape_computed_at_run_time() -> None:
    # The target shape is computed from an input (stage 1 runs on the backend), then compiled in.
    m = _model([helper.make_node("Mul", ["s", "two"], ["s2"]),
                helper.make_node("Reshape", ["x", "s2"], ["y"], name="rsh"),
                helper.make_node("Relu", ["y"], ["z"])],
               [_vi("x", F32, [4, 6]), _vi("s", I64, [2])], [_vi("z", F32, None)],
               inits=(numpy_helper.from_array(np.array([1, 2], np.int64), "two"),))
    sm = load_onnx_model(m, device="cpu")
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    assert _check(m, sm, {"x": x, "s": np.array([12, 1])})["z"].shape == (12, 2)
    assert _check(m, sm, {"x": x, "s": np.array([3, 4])})["z"].shape == (3, 8)
    assert sm.root.stage1 is not None and sm.root.stage1.kind == "graph"
    assert sm.last_origins == {"z": "backend"}


def _nonzero_model(computed: bool) -> Any:
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"],
                                                                                 name="nz_node")] \
        if computed else [helper.make_node("NonZero", ["x"], ["nz"], name="nz_node")]
    nodes += [helper.make_node("Transpose", ["nz"], ["idx"]),
              helper.make_node("GatherND", ["x", "idx"], ["vals"]),
              helper.make_node("Mul", ["vals", "vals"], ["y"])]
    return _model(nodes, [_vi("x", F32, [3, 4])], [_vi("y", F32, None), _vi("nz", I64, None)],
                  inits=(numpy_helper.from_array(np.array(0, np.float32), "zero"),))


def test_plain_import_names_the_data_dependent_node() -> None:
    with pytest.raises(DataDependentShapeError) as e:
        load_onnx(_nonzero_model(False))
    assert e.value.node == "nz_node"


def test_nonzero_gather_chain_runs_on_the_host_between_stages() -> None:
    m = _nonzero_model(False)
    # the host path (rlx-cpu runs NonZero as the bounded op `nonzero`: tests/test_onnx_bounded_ops.py)
    sm = load_onnx_model(m, device="cpu", bounded_ops=False)
    x = np.array([[1, 0, 2, 0], [0, 0, 3, 0], [4, 5, 0, 0]], np.float32)
    _check(m, sm, {"x": x})
    assert sm.last_origins == {"y": "backend", "nz": "host"}
    n = sm.compiles
    _check(m, sm, {"x": x * 7})          # same nonzero count: the next stage is not recompiled
    assert sm.compiles == n
    x2 = x.copy()
    x2[0, 1] = 9
    _check(m, sm, {"x": x2})             # one more nonzero: a new shape, compiled once
    assert sm.compiles == n + 1
    assert "host op NonZero" in sm.describe() and "host-evaluated op(s): NonZero 'nz_node'" in sm.describe()


def test_nonzero_of_a_computed_tensor_runs_stage_one_on_the_backend() -> None:
    m = _nonzero_model(True)
    sm = load_onnx_model(m, device="cpu", bounded_ops=False)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    _check(m, sm, {"x": x})
    s1 = sm.root.stage1
    assert sm.root.kind == "host" and s1 is not None and s1.kind == "graph" and s1.exe is not None
    assert "m" in sm.root.carried or "m" in [o.name for o in s1.proto.graph.output]
    assert len(sm.reports()) >= 2  # every compiled stage has its dispatch report


def test_host_ops_refused_when_disallowed() -> None:
    with pytest.raises(UnsupportedOnnxError) as e:
        load_onnx_model(_nonzero_model(True), device="cpu", host_ops=False, bounded_ops=False)
    msg = str(e.value)
    assert "nz_node" in msg and "NonZero" in msg and "host_ops=True" in msg


def test_compress_with_a_run_time_condition() -> None:
    m = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1),
                helper.make_node("Neg", ["y"], ["z"])],
               [_vi("x", F32, [2, 4]), _vi("c", BOOL, [4])], [_vi("z", F32, None)])
    sm = load_onnx_model(m, device="cpu")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _check(m, sm, {"x": x, "c": np.array([True, False, True, True])})
    _check(m, sm, {"x": x, "c": np.array([False, False, False, False])})


def test_unique_and_nms_are_host_ops() -> None:
    m = _model([helper.make_node("Unique", ["x"], ["u", "i", "inv", "cnt"], sorted=1),
                helper.make_node("Add", ["u", "u"], ["y"])],
               [_vi("x", F32, [6])], [_vi("y", F32, None), _vi("cnt", I64, None)], opset=11)
    sm = load_onnx_model(m, device="cpu")
    _check(m, sm, {"x": np.array([2, 1, 1, 3, 4, 3], np.float32)})
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 10, 1, 11]]], np.float32)
    scores = np.array([[[0.9, 0.75, 0.6]]], np.float32)
    m = _model([helper.make_node("NonMaxSuppression", ["b", "s", "k", "iou"], ["sel"]),
                helper.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1)],
               [_vi("b", F32, [1, 3, 4]), _vi("s", F32, [1, 1, 3])], [_vi("box_idx", I64, None)], opset=11,
               inits=(numpy_helper.from_array(np.array([3], np.int64), "k"),
                      numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
                      numpy_helper.from_array(np.array(2, np.int64), "two")))
    sm = load_onnx_model(m, device="cpu")
    _check(m, sm, {"b": boxes, "s": scores})


def test_if_with_a_run_time_condition_takes_the_branch() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", F32, [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", F32, [3])])
    m = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                helper.make_node("Greater", ["s", "zero"], ["c"]),
                helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
               [_vi("x", F32, [3])], [_vi("y", F32, None)],
               inits=(numpy_helper.from_array(np.array(0, np.float32), "zero"),))
    sm = load_onnx_model(m, device="cpu")
    _check(m, sm, {"x": np.array([1, -2, 3], np.float32)})
    _check(m, sm, {"x": np.array([-1, -2, 0.5], np.float32)})


def test_dynamic_axes_fall_back_to_shape_specialisation() -> None:
    # Range(0, n, 2) with n a dynamic dim: its length ceil(n/2) is no RLX dim, so the model is
    # imported again per input shape, and rows 0, 2, 4 ... are gathered on the backend.
    m = _model([helper.make_node("Shape", ["x"], ["sh"], start=0, end=1),
                helper.make_node("Squeeze", ["sh", "ax0"], ["n"]),
                helper.make_node("Range", ["zero", "n", "two"], ["r"]),
                helper.make_node("Gather", ["x", "r"], ["y"], axis=0)],
               [_vi("x", F32, ["n", 3])], [_vi("y", F32, None)], opset=15,
               inits=(numpy_helper.from_array(np.array(0, np.int64), "zero"),
                      numpy_helper.from_array(np.array(2, np.int64), "two"),
                      numpy_helper.from_array(np.array([0], np.int64), "ax0")))
    sm = load_onnx_model(m, device="cpu")
    assert sm.root.kind == "shapes"
    for n in (5, 6, 5):
        _check(m, sm, {"x": np.arange(3 * n, dtype=np.float32).reshape(n, 3)})
    assert sm.compiles == 2
    assert "shape-specialised" in sm.describe()


def test_a_model_without_boundaries_is_one_graph() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", F32, [3])], [_vi("y", F32, None)])
    sm = load_onnx_model(m, device="cpu")
    assert not sm.staged and sm.graph is not None
    _check(m, sm, {"x": np.array([-1, 0, 2], np.float32)})
    assert "no staging" in sm.describe()


def test_speculative_value_freeze_of_a_run_time_count() -> None:
    # OneHot with a run-time depth: staged execution compiles the depth in per value.
    m = _model([helper.make_node("OneHot", ["i", "d", "v"], ["y"])],
               [_vi("i", I64, [3]), _vi("d", I64, [])], [_vi("y", F32, None)], opset=11,
               inits=(numpy_helper.from_array(np.array([0, 1], np.float32), "v"),))
    sm = load_onnx_model(m, device="cpu")
    _check(m, sm, {"i": np.array([0, 2, 1]), "d": np.array(3)})
    _check(m, sm, {"i": np.array([0, 2, 1]), "d": np.array(4)})
    assert sm.compiles == 2 and "speculative" in sm.describe()


def test_cli_run_and_explain_use_staged_execution(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from rlx_core.cli import cli

    path = tmp_path / "nz.onnx"
    onnx.save(_nonzero_model(True), str(path))
    x = np.array([[1, -1, 2, 0], [0, 3, -4, 5], [-1, -1, -1, 6]], np.float32)
    np.save(tmp_path / "x.npy", x)
    res = CliRunner().invoke(cli, ["run", str(path), "--device", "cpu", "-i", f"x={tmp_path / 'x.npy'}",
                                   "--json"], prog_name="rlx")
    assert res.exit_code == 0, res.output
    assert "bounded op(s) on cpu:0 (trimmed at the cut): NonZero 'nz_node'" in res.output  # the stages
    data = json.loads(res.stdout)
    want: Any = ReferenceEvaluator(_nonzero_model(True)).run(None, {"x": x})
    np.testing.assert_allclose(data["outputs"]["y"]["preview"], want[0].tolist())
    res = CliRunner().invoke(cli, ["explain", str(path), "--device", "cpu"], prog_name="rlx")
    assert res.exit_code == 0, res.output
    assert "bounded op NonZero" in res.output and "model/stage1:" in res.output
    assert "Dispatch report" in res.output


def test_speculative_freeze_that_does_not_help_raises_the_handlers_refusal() -> None:
    # Reflect padding by more than 2 on a side of 3 is refused whatever the pads' origin: once the
    # run-time pads are a constant, the next stage's import refuses it again, and that error surfaces.
    m = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
               [_vi("x", F32, [2, 3]), _vi("pads", I64, [4])], [_vi("y", F32, None)], opset=18)
    sm = load_onnx_model(m, device="cpu")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _check(m, sm, {"x": x, "pads": np.array([0, 1, 0, 2])})
    with pytest.raises(UnsupportedOnnxError, match="more than 2 per side"):
        sm.run({"x": x, "pads": np.array([0, 3, 0, 0])})
