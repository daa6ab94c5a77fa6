"""ONNX training optimizers, ai.onnx.ml ops, Optional on tensors, empty-set Reduce*, predicated If
(``rlx_core.frontends.onnx_misc2`` / ``onnx_optional`` / ``onnx.py``, issue 17).

Each model is imported, compiled on rlx-cpu and compared with onnx's ReferenceEvaluator or a NumPy
float64 reference; what cannot be translated must be refused with UnsupportedOnnxError (or, for a
run-time If that cannot be predicated, RuntimeValueError so staged execution takes the branch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from _onnxtools import make_model, run_rlx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import RuntimeValueError, UnsupportedOnnxError, load_onnx  # noqa: E402

F32, F64, I64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
TRAINING, ML = "ai.onnx.preview.training", "ai.onnx.ml"


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def domain_model(node: Any, inputs: Sequence[tuple[str, int, Sequence[int]]], outputs: Sequence[str],
                 domain: str, version: int = 1) -> Any:
    """A model of one node from ``domain`` (and no default-domain opset, as the ONNX tests write it)."""
    graph = helper.make_graph([node], "case",
                              [helper.make_tensor_value_info(n, dt, list(s)) for n, dt, s in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                               for o in outputs])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version)])
    m.ir_version = 8
    return m


def compare(m: Any, feeds: dict[str, np.ndarray], ref: list[np.ndarray] | None = None,
            rtol: float = 1e-5, atol: float = 1e-6) -> list[np.ndarray]:
    if ref is None:
        ref = [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]
    got = run_rlx(m, feeds)
    assert len(got) == len(ref)
    for g, w in zip(got, ref):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind in "iub":
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return got


# -- ai.onnx.preview.training ------------------------------------------------------------------

def _opt_feeds(rng: np.random.Generator, t: int, groups: int, shapes: Sequence[tuple[int, ...]]
               ) -> dict[str, np.ndarray]:
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(t, np.int64)}
    for k in range(groups):
        for j, s in enumerate(shapes):
            feeds[f"g{k}_{j}"] = rng.standard_normal(s).astype(np.float32)
            if k >= 2:  # accumulated squares stay non-negative (H of Adagrad and Adam)
                feeds[f"g{k}_{j}"] = np.abs(feeds[f"g{k}_{j}"])
    return feeds


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("op, groups, attrs", [
    ("Adagrad", 3, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}),
    ("Adagrad", 3, {}),
    ("Adam", 4, {"alpha": 0.95, "beta": 0.1, "epsilon": 1e-7, "norm_coefficient": 0.001,
                 "norm_coefficient_post": 0.02}),
    ("Adam", 4, {}),
    ("Momentum", 3, {"alpha": 0.95, "beta": 0.1, "mode": "standard", "norm_coefficient": 0.001}),
    ("Momentum", 3, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
])
@pytest.mark.parametrize("shapes", [[(3,)], [(2,), (2, 3)]])
def test_training_optimizers(op: str, groups: int, attrs: dict, t: int, shapes: list) -> None:
    rng = np.random.default_rng(0)
    feeds = _opt_feeds(rng, t, groups, shapes)
    names = [f"g{k}_{j}" for k in range(groups) for j in range(len(shapes))]
    outs = [f"o{k}_{j}" for k in range(groups - 1) for j in range(len(shapes))]
    node = helper.make_node(op, ["R", "T", *names], outs, domain=TRAINING, **attrs)
    inputs = [("R", F32, []), ("T", I64, [])] + [(n, F32, feeds[n].shape) for n in names]
    compare(domain_model(node, inputs, outs, TRAINING), feeds)


def test_momentum_bad_mode_is_refused() -> None:
    node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X2", "V2"], domain=TRAINING,
                            alpha=0.9, beta=0.1, mode="heavy", norm_coefficient=0.0)
    m = domain_model(node, [("R", F32, []), ("T", I64, [])] + [(n, F32, [2]) for n in "XGV"], ["X2", "V2"],
                     TRAINING)
    with pytest.raises(UnsupportedOnnxError, match="mode='heavy'"):
        load_onnx(m)


# -- ai.onnx.ml --------------------------------------------------------------------------------

@pytest.mark.parametrize("threshold", [0.0, 1.0, -0.5])
def test_binarizer(threshold: float) -> None:
    x = np.array([[-1.0, 0.0, 1.0, 2.0], [np.nan, np.inf, -np.inf, 0.5]], np.float32)
    node = helper.make_node("Binarizer", ["X"], ["Y"], domain=ML, threshold=threshold)
    compare(domain_model(node, [("X", F32, x.shape)], ["Y"], ML), {"X": x}, atol=0)


@pytest.mark.parametrize("xshape, idx", [((3, 4), [0, 3]), ((4,), [2, 1, 1]), ((2, 3, 5), [[4, 0]]),
                                         ((3, 4), [-1, 0])])
def test_array_feature_extractor(xshape: tuple[int, ...], idx: list) -> None:
    x = np.arange(np.prod(xshape), dtype=np.float32).reshape(xshape)
    y = np.asarray(idx, np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "y"], ["z"], domain=ML)
    m = domain_model(node, [("x", F32, x.shape), ("y", I64, y.shape)], ["z"], ML)
    compare(m, {"x": x, "y": y}, atol=0)


def test_unregistered_ml_operator_is_unsupported() -> None:
    node = helper.make_node("Scaler", ["X"], ["Y"], domain=ML, scale=[2.0])
    with pytest.raises(UnsupportedOnnxError):
        load_onnx(domain_model(node, [("X", F32, [2])], ["Y"], ML))


# -- empty-set reductions ----------------------------------------------------------------------

@pytest.mark.parametrize("op, dtype, want", [
    ("ReduceMax", np.float32, -np.inf), ("ReduceMin", np.float32, np.inf),
    ("ReduceMax", np.bool_, False), ("ReduceMin", np.bool_, True),
    ("ReduceMax", np.int32, np.iinfo(np.int32).min), ("ReduceMin", np.int64, np.iinfo(np.int64).max),
    ("ReduceLogSumExp", np.float32, -np.inf),
])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_empty_set_reduction_runs_on_the_backend(op: str, dtype: Any, want: Any, keepdims: int) -> None:
    x = np.zeros((2, 0, 4), dtype)
    onnx_dt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = make_model(helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims), [("x", onnx_dt, x.shape)],
                   ["y"], {"axes": np.array([1], np.int64)}, opset=18)
    shape = (2, 1, 4) if keepdims else (2, 4)
    (got,) = compare(m, {"x": x}, [np.full(shape, want, dtype)], atol=0)
    graph = load_onnx(m)
    assert "reduce_sum" in {n.op for n in graph.nodes}  # computed from the input, not a folded constant
    assert got.dtype == np.dtype(dtype)


# -- If with a run-time condition ------------------------------------------------------------

def _if_model(then_shape: Sequence[int], else_mul: float = 3.0) -> Any:
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", F32, list(then_shape))])
    c = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", F32, [], [else_mul]))
    else_g = helper.make_graph([c, helper.make_node("Mul", ["x", "k"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", F32, [2, 3])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)
    graph = helper.make_graph([node], "ifcase", [helper.make_tensor_value_info("cond", BOOL, []),
                                                 helper.make_tensor_value_info("x", F32, [2, 3])],
                              [helper.make_tensor_value_info("y", F32, [2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("cond", [True, False])
def test_if_runtime_condition_is_predicated(cond: bool) -> None:
    m = _if_model([2, 3])
    x = np.array([[1.0, -2.0, np.inf], [np.nan, 0.5, -0.0]], np.float32)
    graph = load_onnx(m)  # one graph: no staging, both branches and a where() on the backend
    assert "where" in {n.op for n in graph.nodes}
    feeds = {"cond": np.array(cond), "x": x}
    compare(m, feeds, atol=0, rtol=0)


def test_if_branches_of_different_shapes_are_staged() -> None:
    m = _if_model([2, 3])
    g = m.graph.node[0].attribute[0].g if m.graph.node[0].attribute[0].name == "then_branch" \
        else m.graph.node[0].attribute[1].g
    # then: Reshape x to (3, 2), a shape the else branch does not have
    shape = helper.make_node("Constant", [], ["s"], value=helper.make_tensor("sv", I64, [2], [3, 2]))
    del g.node[:]
    g.node.extend([shape, helper.make_node("Reshape", ["x", "s"], ["t_out"])])
    with pytest.raises(RuntimeValueError):
        load_onnx(m)


# -- Optional on tensors -------------------------------------------------------------------------

def test_optional_has_element_without_input_is_false() -> None:
    m = make_model(helper.make_node("OptionalHasElement", [], ["y"]), [], ["y"], opset=18)
    m.graph.output[0].type.tensor_type.elem_type = BOOL
    assert run_rlx(m, {})[0].item() is False


def test_optional_and_get_element_pass_a_tensor_through() -> None:
    nodes = [helper.make_node("Optional", ["x"], ["o"]), helper.make_node("OptionalGetElement", ["o"], ["g"]),
             helper.make_node("Mul", ["g", "x"], ["y"]), helper.make_node("OptionalHasElement", ["o"], ["h"])]
    graph = helper.make_graph(nodes, "opt", [helper.make_tensor_value_info("x", F32, [3])],
                              [helper.make_tensor_value_info("y", F32, [3]),
                               helper.make_tensor_value_info("h", BOOL, [])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    x = np.array([1.0, -2.0, 3.0], np.float32)
    # NumPy reference: onnx's ReferenceEvaluator wraps Optional's tensor in a list, which Mul rejects
    compare(m, {"x": x}, [x * x, np.array(True)], atol=0)


def test_empty_optional_is_refused() -> None:
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F32, [3]))
    nodes = [helper.make_node("Optional", [], ["o"], type=opt_t),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "opt", [], [helper.make_tensor_value_info("y", F32, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(UnsupportedOnnxError, match="empty Optional"):
        load_onnx(m)


# -- TreeEnsemble ----------------------------------------------------------------------------------

def _tree_model(aggregate: int, dtype: Any, post: int = 0) -> Any:
    from onnx import numpy_helper

    nan = np.nan
    # two trees: nodes 0-3 (LEQ, MEMBER, GT with NaN to true, NEQ) and 4-6 (LT with NaN to true, GTE, MEMBER)
    attrs = {
        "nodes_modes": numpy_helper.from_array(np.array([0, 6, 3, 5, 1, 2, 6], np.uint8), "modes"),
        "nodes_featureids": [0, 1, 2, 0, 1, 2, 0],
        "nodes_splits": numpy_helper.from_array(np.array([0.5, nan, 1.0, 2.0, 2.0, 0.0, nan], dtype), "s"),
        "nodes_truenodeids": [1, 0, 2, 3, 5, 6, 7], "nodes_trueleafs": [0, 1, 1, 1, 1, 1, 1],
        "nodes_falsenodeids": [2, 1, 3, 4, 5, 6, 8], "nodes_falseleafs": [0, 1, 0, 1, 0, 0, 1],
        "nodes_missing_value_tracks_true": [0, 0, 1, 0, 1, 0, 0],
        "membership_values": numpy_helper.from_array(np.array([1, 3, nan, 2, 5, nan], dtype), "mv"),
        "leaf_targetids": [0, 1, 0, 1, 0, 1, 0, 1, 1],
        "leaf_weights": numpy_helper.from_array(np.array([1.5, -2.0, 0.25, 3.0, -1.0, 0.5, 2.5, -0.75, 4.0],
                                                         dtype), "w"),
        "tree_roots": [0, 4], "n_targets": 2, "aggregate_function": aggregate, "post_transform": post,
    }
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain=ML, **attrs)
    m = domain_model(node, [("X", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [8, 3])], ["Y"], ML, 5)
    return m


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble(aggregate: int, dtype: Any) -> None:
    x = np.array([[0.0, 1.0, 2.0], [1.0, 3.0, np.nan], [2.0, np.nan, -1.0], [0.5, 3.0, 0.0],
                  [np.nan, 2.0, 5.0], [5.0, 4.0, -3.0], [-1.0, 1.5, 1.0], [2.0, 0.0, 1.5]], dtype)
    compare(_tree_model(aggregate, dtype), {"X": x}, rtol=1e-6, atol=0)


def test_tree_ensemble_post_transform_is_refused() -> None:
    with pytest.raises(UnsupportedOnnxError, match="post_transform=LOGISTIC"):
        load_onnx(_tree_model(1, np.float32, post=2))


def _optional_input_model(nodes: list, outputs: list) -> Any:
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F32, [3]))
    opt = helper.make_value_info("x", opt_t)
    graph = helper.make_graph(nodes, "opt_in", [opt], outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_optional_input_is_keyed_on_presence() -> None:
    from rlx_core.frontends.onnx_backend import PresenceRep, RLXBackend

    m = _optional_input_model([helper.make_node("OptionalHasElement", ["x"], ["h"])],
                              [helper.make_tensor_value_info("h", BOOL, [])])
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    assert isinstance(rep, PresenceRep)
    assert rep.run([np.ones(3, np.float32)])[0].item() is True
    assert rep.run([None])[0].item() is False
    assert rep.run([np.zeros(3, np.float32)])[0].item() is True
    assert len(rep.variants) == 2


def test_optional_input_present_is_the_tensor_and_empty_get_is_refused() -> None:
    from rlx_core.frontends.onnx_backend import RLXBackend

    nodes = [helper.make_node("OptionalGetElement", ["x"], ["g"]), helper.make_node("Add", ["g", "g"], ["y"])]
    m = _optional_input_model(nodes, [helper.make_tensor_value_info("y", F32, [3])])
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    x = np.array([1.0, -2.5, np.inf], np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], x + x)
    assert rep.graph is not None and rep.staged is None  # one plain graph computes it
    with pytest.raises(UnsupportedOnnxError, match="empty optional"):
        rep.run([None])


# -- value-keyed inputs fed to the next stage: windows and Range on the backend ------------------

def _staged(m: Any) -> Any:
    from rlx_core.frontends.onnx_staged import load_onnx_model
    from rlx_core.runtime import Session

    return load_onnx_model(m, session=Session("cpu", use_cache=False))


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("out_dt", [F32, F64])
def test_window_with_runtime_size_runs_on_the_backend(op: str, periodic: int, out_dt: int) -> None:
    node = helper.make_node(op, ["n"], ["y"], periodic=periodic, output_datatype=out_dt)
    graph = helper.make_graph([node], "win", [helper.make_tensor_value_info("n", TensorProto.INT32, [])],
                              [helper.make_tensor_value_info("y", out_dt, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sm = _staged(m)
    for n in (1, 2, 7, 10, 64):
        feeds = {"n": np.array(n, np.int32)}
        want = ReferenceEvaluator(m).run(None, feeds)[0]
        got = sm.run(feeds)["y"]
        assert got.dtype == want.dtype and got.shape == want.shape == (n,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert sm.last_origins == {"y": "backend"}  # computed from the fed size, not folded at import


def test_window_integer_output_with_runtime_size_is_folded_not_translated() -> None:
    # The handler does not compute truncated integer windows; the value-keyed stage folds it instead
    # (onnx's reference), and says so: the output's origin is the host.
    node = helper.make_node("HannWindow", ["n"], ["y"], output_datatype=TensorProto.INT64)
    graph = helper.make_graph([node], "win", [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = {"n": np.array(8, np.int64)}
    sm = _staged(m)
    np.testing.assert_array_equal(sm.run(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])
    assert sm.last_origins == {"y": "host"}


@pytest.mark.parametrize("dtype, start, limit, delta", [(np.float32, 0.5, 7.0, 1.25), (np.int32, 10, -3, -3),
                                                        (np.int64, 2, 2, 1), (np.float32, -1.0, 1.0, 0.1)])
def test_range_of_runtime_values_runs_on_the_backend(dtype: Any, start: Any, limit: Any, delta: Any) -> None:
    onnx_dt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("Range", ["s", "l", "d"], ["y"])], "range",
                              [helper.make_tensor_value_info(n, onnx_dt, []) for n in "sld"],
                              [helper.make_tensor_value_info("y", onnx_dt, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"s": np.array(start, dtype), "l": np.array(limit, dtype), "d": np.array(delta, dtype)}
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    sm = _staged(m)
    got = sm.run(feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if want.size:
        assert sm.last_origins == {"y": "backend"}


def test_if_with_a_random_branch_is_not_predicated() -> None:
    m = _if_model([2, 3])
    attr = next(a for a in m.graph.node[0].attribute if a.name == "else_branch")
    rnd = helper.make_node("RandomNormalLike", ["x"], ["r"])
    del attr.g.node[:]
    attr.g.node.extend([rnd, helper.make_node("Add", ["x", "r"], ["e_out"])])
    with pytest.raises(RuntimeValueError):  # staged execution takes the branch: one random draw
        load_onnx(m)
