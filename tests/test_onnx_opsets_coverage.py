"""ONNX importer: opsets 1-28 with per-operator version checks, small translation gaps (Slice-1,
Pad-2 and run-time pad values, LayerNormalization's Mean/InvStdDev, ArgMax select_last_index,
ML-domain models) and the up-front coverage report (``coverage()``, ``rlx explain --coverage``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core.frontends import onnx as ox  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, coverage, load_onnx  # noqa: E402
from rlx_core.frontends.onnx_backend import RLXBackend  # noqa: E402

RNG = np.random.default_rng(17)


def _model(nodes: list[Any], inputs: list[tuple[str, int, Any]], outputs: list[str], opset: int,
           inits: dict[str, np.ndarray] | None = None, domains: dict[str, int] | None = None) -> Any:
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(o, 0, None) for o in outputs],
                     [nh.from_array(v, k) for k, v in (inits or {}).items()])
    ops = [h.make_opsetid("", opset)] if opset else []
    ops += [h.make_opsetid(d, v) for d, v in (domains or {}).items()]
    return h.make_model(g, opset_imports=ops, ir_version=8)


def _check(model: Any, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> list[np.ndarray]:
    want = ReferenceEvaluator(model).run(None, feeds)
    got = RLXBackend.run_model(model, [feeds[i.name] for i in model.graph.input], freeze_inputs=False)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return list(got)


# -- opsets and operator versions ---------------------------------------------------------------

def test_opset_range_is_onnx_latest() -> None:
    assert ox.MIN_OPSET == 1 and ox.MAX_OPSET == 28
    assert ox.MAX_OPSET <= onnx.defs.onnx_opset_version()


def test_every_translated_operator_version_up_to_max_was_reviewed() -> None:
    """A new onnx release or a new handler must not widen what is accepted silently: every version
    of a translated operator newer than its opset-23 one is listed in _OP_REVIEWED."""
    for op in ox._HANDLERS:
        v23, vmax = ox._since(op, 23), ox._since(op, ox.MAX_OPSET)
        if v23 is not None and vmax is not None and vmax > v23:
            assert ox._OP_REVIEWED.get(op, 0) >= vmax, op


def test_operator_versions_outside_the_handlers_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ox.op_version_problem("Add", 7) is None
    old = ox.op_version_problem("Add", 6) or ""
    assert "Add-6" in old and "older" in old
    assert ox.op_version_problem("Not", 1) is None  # unchanged since opset 1
    assert ox.op_version_problem("Cast", 28) is None
    monkeypatch.delitem(ox._OP_REVIEWED, "Cast")
    assert "newer" in (ox.op_version_problem("Cast", 24) or "")
    m = _model([h.make_node("Add", ["x", "x"], ["y"])], [("x", T.FLOAT, [2])], ["y"], 6)
    with pytest.raises(UnsupportedOnnxError, match="Add-6") as ei:
        load_onnx(m)
    assert "convert_version" in ei.value.fix


@pytest.mark.parametrize("opset", [7, 9])
def test_old_opset_attributes(opset: int) -> None:
    """Slice-1, Pad-2, Clip-6, Split-2, Concat-4, Reshape-5 and Squeeze-1 read their attributes."""
    nodes = [h.make_node("Slice", ["x"], ["s"], starts=[1, 0], ends=[3, 100], axes=[0, 1]),
             h.make_node("Pad", ["s"], ["p"], pads=[0, 1, 1, 0], value=2.5),
             h.make_node("Clip", ["p"], ["c"], min=-0.5, max=2.0),
             h.make_node("Split", ["c"], ["a", "b"], axis=1, split=[2, 3]),
             h.make_node("Concat", ["b", "a"], ["k"], axis=1),
             h.make_node("Reshape", ["k", "shape"], ["r"]),
             h.make_node("Unsqueeze", ["r"], ["u"], axes=[0]),
             h.make_node("Squeeze", ["u"], ["y"], axes=[0])]
    m = _model(nodes, [("x", T.FLOAT, [4, 4])], ["y"], opset, {"shape": np.array([5, 3], np.int64)})
    _check(m, {"x": RNG.standard_normal((4, 4)).astype(np.float32)})


def test_opset_7_logical_and_opset_28_cast() -> None:
    m = _model([h.make_node("And", ["a", "b"], ["y"])], [("a", T.BOOL, [2, 3]), ("b", T.BOOL, [3])], ["y"], 7)
    _check(m, {"a": RNG.random((2, 3)) > 0.5, "b": RNG.random(3) > 0.5})
    m = _model([h.make_node("Cast", ["x"], ["c"], to=T.FLOAT16), h.make_node("Transpose", ["c"], ["y"])],
               [("x", T.FLOAT, [2, 3])], ["y"], 28)
    _check(m, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    m = _model([h.make_node("Cast", ["x"], ["y"], to=T.FLOAT8E8M0, round_mode="up")],
               [("x", T.FLOAT, [2])], ["y"], 24)
    with pytest.raises(UnsupportedOnnxError, match="FLOAT8E8M0"):
        load_onnx(m)


def test_ml_domain_only_model_names_the_domain() -> None:
    # Normalizer: an ai.onnx.ml operator without a translation (Binarizer has one: onnx_misc2)
    m = _model([h.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="MAX")],
               [("x", T.FLOAT, [2])], ["y"], 0, domains={"ai.onnx.ml": 1})
    with pytest.raises(UnsupportedOnnxError, match=r"'ai\.onnx\.ml'") as ei:
        load_onnx(m)
    assert "default ONNX domain" in ei.value.fix and "register_handler" in ei.value.fix


# -- translation gaps ---------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_norm_mean_and_inv_std_dev(axis: int) -> None:
    x = (RNG.standard_normal((2, 3, 4)) * 3 + 1).astype(np.float32)
    ln = h.make_node("LayerNormalization", ["x", "w", "b"], ["y", "mean", "inv"], axis=axis, epsilon=1e-3)
    norm = x.shape[axis % 3:]
    w, b = (RNG.standard_normal(norm).astype(np.float32) for _ in range(2))
    m = _model([ln], [("x", T.FLOAT, list(x.shape))], ["y", "mean", "inv"], 17, {"w": w, "b": b})
    _check(m, {"x": x}, rtol=1e-4)


def test_layer_norm_statistics_of_float16_are_float32() -> None:
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    ln = h.make_node("LayerNormalization", ["x", "w"], ["y", "", "inv"])
    m = _model([ln], [("x", T.FLOAT16, [3, 8])], ["y", "inv"], 17, {"w": np.ones(8, np.float16)})
    y, inv = RLXBackend.run_model(m, [x], freeze_inputs=False)
    assert y.dtype == np.float16 and inv.dtype == np.float32 and inv.shape == (3, 1)
    x64 = x.astype(np.float64)
    want = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(inv, want, rtol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_select_last_index(op: str, keepdims: int) -> None:
    x = RNG.integers(0, 3, (4, 5)).astype(np.float32)  # many ties
    m = _model([h.make_node(op, ["x"], ["y"], axis=1, keepdims=keepdims, select_last_index=1)],
               [("x", T.FLOAT, [4, 5])], ["y"], 13)
    _check(m, {"x": x})


def test_pad_value_computed_at_run_time() -> None:
    nodes = [h.make_node("Pad", ["x", "pads", "v"], ["y"])]
    m = _model(nodes, [("x", T.FLOAT, [2, 3]), ("v", T.FLOAT, [])], ["y"], 18,
               {"pads": np.array([1, 0, 0, 2], np.int64)})
    for v in (np.float32(1.5), np.float32(np.inf)):
        _check(m, {"x": RNG.standard_normal((2, 3)).astype(np.float32), "v": v})


# -- the coverage report ------------------------------------------------------------------------

def _messy_model() -> Any:
    then = h.make_graph([h.make_node("Bernoulli", ["x"], ["t"], name="inner_bernoulli")], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, None)])
    other = h.make_graph([h.make_node("Relu", ["x"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", T.FLOAT, None)])
    nodes = [h.make_node("Relu", ["x"], ["a"], name="relu"),
             h.make_node("Bernoulli", ["a"], ["b"], name="hm1"),  # random: never translated
             h.make_node("Bernoulli", ["b"], ["c"], name="hm2"),
             h.make_node("MaxPool", ["c"], ["d"], name="pool", kernel_shape=[1, 1], auto_pad="BOGUS"),
             h.make_node("Cast", ["d"], ["e8"], name="to_fp8", to=T.FLOAT8E8M0),  # no RLX dtype
             h.make_node("Cast", ["e8"], ["f"], name="back", to=T.FLOAT),
             h.make_node("LinearRegressor", ["f"], ["g"], name="ml", domain="ai.onnx.ml"),
             h.make_node("Mod", ["s", "s"], ["k"], name="folded_mod"),  # constant inputs: folded
             h.make_node("BatchNormalization", ["g", "s", "s", "s", "s"], ["p", "mean"], name="bn_stats"),
             h.make_node("If", ["cond"], ["i"], name="branch", then_branch=then, else_branch=other),
             h.make_node("Add", ["p", "i"], ["y"], name="add")]
    return _model(nodes, [("x", T.FLOAT, [1, 3, 4, 4]), ("cond", T.BOOL, [])], ["y", "k"], 17,
                  {"s": np.ones(3, np.float32)}, {"ai.onnx.ml": 1})


def test_coverage_lists_every_problem_at_once() -> None:
    r = coverage(_messy_model())
    assert not r.ok and r.opset == 17 and r.nodes == 13 and r.folded == 1  # 11 + 2 in the If branches
    got = {(p.kind, p.op): p.nodes for p in r.problems}
    assert got == {("domain", "ai.onnx.ml.LinearRegressor"): ["ml"],
                   ("operator", "Bernoulli"): ["hm1", "hm2", "branch/inner_bernoulli"],
                   ("attribute", "MaxPool"): ["pool"],
                   ("dtype", "Cast"): ["to_fp8"],
                   ("attribute", "BatchNormalization"): ["bn_stats"]}
    assert [p.kind for p in r.problems] == ["domain", "operator", "attribute", "attribute", "dtype"]
    text = r.to_text()
    assert "3 node(s): 'hm1', 'hm2', 'branch/inner_bernoulli'" in text and "auto_pad='BOGUS'" in text
    assert "without training_mode=1" in text
    data = r.to_json()
    assert data["ok"] is False and data["unsupported_nodes"] == 7 and data["ops"]["Bernoulli"] == 3


def test_coverage_opset_problems_and_a_clean_model() -> None:
    m = _model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], ["y"], 5)  # Relu-1
    r = coverage(m)
    assert [(p.kind, p.op) for p in r.problems] == [("version", "Relu")]
    m = _model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], ["y"], 30)
    assert [p.kind for p in coverage(m).problems] == ["opset"]
    m = _model([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_UPPER")],
               [("x", T.FLOAT, [1, 1, 4, 4])], ["y"], 17)  # a string attribute, read as the importer does
    r = coverage(m)
    assert r.ok and "every node is supported" in r.to_text()


def test_rlx_explain_coverage(tmp_path: Path) -> None:
    from rlx_core.cli import cli

    bad, good = tmp_path / "bad.onnx", tmp_path / "good.onnx"
    onnx.save(_messy_model(), str(bad))
    onnx.save(_model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], ["y"], 17), str(good))
    res = CliRunner().invoke(cli, ["explain", str(bad), "--coverage"])
    assert res.exit_code == 1, res.output
    assert "[operator] Bernoulli" in res.output and "[domain] ai.onnx.ml.LinearRegressor" in res.output
    res = CliRunner().invoke(cli, ["explain", str(bad)])  # the import's first error points here
    assert res.exit_code == 1 and "--coverage lists every unsupported node" in res.output
    res = CliRunner().invoke(cli, ["explain", str(good), "--coverage", "--json"])
    assert res.exit_code == 0, res.output
    assert '"ok": true' in res.output
    rlx = tmp_path / "m.rlx"
    rlx.write_bytes(b"")
    res = CliRunner().invoke(cli, ["explain", str(rlx), "--coverage"])
    assert res.exit_code == 2 and "checks an .onnx file" in res.output


def test_reductions_of_bool_and_empty_sets() -> None:
    b = RNG.random((3, 4)) > 0.5
    for op in ("ReduceMax", "ReduceMin"):
        m = _model([h.make_node(op, ["x", "axes"], ["y"], keepdims=0)], [("x", T.BOOL, [3, 4])], ["y"], 20,
                   {"axes": np.array([1], np.int64)})
        _check(m, {"x": b})
    for op, dt, npdt in (("ReduceMax", T.FLOAT, np.float32), ("ReduceMin", T.INT32, np.int32),
                         ("ReduceLogSumExp", T.FLOAT, np.float32), ("ReduceMax", T.BOOL, np.bool_)):
        m = _model([h.make_node("Relu" if dt == T.FLOAT else "Identity", ["x"], ["r"]),
                    h.make_node(op, ["r", "axes"], ["y"], keepdims=1)], [("x", dt, [2, 0, 3])], ["y"], 20,
                   {"axes": np.array([1], np.int64)})
        [got] = _check(m, {"x": np.zeros((2, 0, 3), npdt)})
        assert got.shape == (2, 1, 3)


def test_pow_dtypes_and_integer_max_pool() -> None:
    m = _model([h.make_node("Pow", ["x", "e"], ["y"])], [("x", T.FLOAT, [4]), ("e", T.INT64, [4])], ["y"], 15)
    _check(m, {"x": np.array([1.5, -2, 3, 0.5], np.float32), "e": np.array([2, 3, -1, 0], np.int64)})
    m = _model([h.make_node("Pow", ["x", "e"], ["y"])], [("x", T.INT32, [4]), ("e", T.INT32, [4])], ["y"], 15)
    _check(m, {"x": np.array([3, -7, 2, 5], np.int32), "e": np.array([5, 3, 40, 0], np.int32)})  # 2**40 wraps
    m = _model([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0])],
               [("x", T.UINT8, [1, 2, 4, 4])], ["y"], 12)
    x = RNG.integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
    ort = pytest.importorskip("onnxruntime")  # onnx's reference pads uint8 with a NaN cast
    m.graph.output[0].type.tensor_type.elem_type = T.UINT8  # ORT wants the output's type
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = RLXBackend.run_model(m, [x], freeze_inputs=False)
    assert got[0].dtype == np.uint8 and np.array_equal(got[0], want[0])


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap", "constant"])
def test_pad_modes_and_cropping(mode: str) -> None:
    pads = [1, 2, 0, 2, 3, 1] if mode != "constant" else [1, -2, 0, -1, 2, 1]  # 3-D: corners too
    m = _model([h.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], [("x", T.FLOAT, [3, 4, 5])], ["y"], 18,
               {"pads": np.array(pads, np.int64)})
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    if mode != "constant":
        _check(m, {"x": x}, rtol=0)
    else:  # onnx's reference cannot crop: x[:-1, 2:, :] padded by (1, 0), (0, 2), (0, 1)
        [got] = RLXBackend.run_model(m, [x], freeze_inputs=False)
        np.testing.assert_array_equal(got, np.pad(x[:-1, 2:, :], [(1, 0), (0, 2), (0, 1)]))
    m = _model([h.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")], [("x", T.FLOAT, [2, 3])], ["y"],
               18, {"pads": np.array([0, 3, 0, 0], np.int64)})
    with pytest.raises(UnsupportedOnnxError, match="more than 2 per side"):
        load_onnx(m)


@pytest.mark.parametrize(("op", "attrs"), [
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 0, 0, 1]}),
    ("AveragePool", {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "dilations": [1, 2, 1],
                     "pads": [1, 1, 0, 0, 1, 1], "count_include_pad": 1, "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 2, 2], "pads": [1, 0, 1, 1, 0, 0], "ceil_mode": 1,
                     "strides": [2, 2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                     "count_include_pad": 1}),  # 2-D: the last window passes the padding
    ("MaxPool", {"kernel_shape": [2, 2, 2], "strides": [2, 1, 2], "ceil_mode": 1}),
])
def test_nd_and_dilated_pooling(op: str, attrs: dict[str, Any]) -> None:
    shape = [1, 2, 5, 6] if len(attrs["kernel_shape"]) == 2 else [1, 2, 5, 6, 7]
    m = _model([h.make_node(op, ["x"], ["y"], **attrs)], [("x", T.FLOAT, shape)], ["y"], 19)
    _check(m, {"x": RNG.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_match_onnxruntime(storage_order: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    node = h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                       storage_order=storage_order)
    m = _model([node], [("x", T.FLOAT, [2, 3, 5, 4])], ["y", "i"], 12)
    m.graph.output[0].type.tensor_type.elem_type = T.FLOAT
    m.graph.output[1].type.tensor_type.elem_type = T.INT64
    x = RNG.integers(0, 4, (2, 3, 5, 4)).astype(np.float32)  # ties: the first maximum wins
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = RLXBackend.run_model(m, [x], freeze_inputs=False)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
