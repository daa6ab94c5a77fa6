"""Import-time constant folding is budgeted (issue 14, item 4).

A 158-byte ONNX file once took 43 s and 3.6 GB in ``rlx explain`` ("nothing runs") because every node
with constant inputs was folded at import, however large its result. Now a fold that would amplify
beyond the budget (ConstantOfShape, Expand, Tile, Range, broadcasting) stays a run-time graph node.
The tests assert on behaviour (what is materialised, peak traced memory), never on timing.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.cli import cli  # noqa: E402
from rlx_core.errors import RLXError  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

#: Peak Python-traced memory (NumPy's buffers included) an import or explain may use here; the
#: amplifying models below would need 160 MB to 1.3 GB if they were folded.
PEAK_LIMIT = 100 << 20


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.setenv("RLX_NO_CACHE", "1")
    monkeypatch.delenv("RLX_ONNX_FOLD_MAX_ELEMENTS", raising=False)
    monkeypatch.delenv("RLX_ONNX_FOLD_MAX_BYTES", raising=False)
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def const(name: str, value: Any) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def model(nodes: list, out: str, elem: int, inputs: list | None = None, opset: int = 13) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "amp", inputs or [], [helper.make_tensor_value_info(out, elem, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def constant_of_shape(rows: int) -> onnx.ModelProto:
    """ConstantOfShape [rows, 10000] -> Add -> ReduceSum: a few hundred bytes of file."""
    return model([const("s", np.array([rows, 10000], np.int64)),
                  helper.make_node("ConstantOfShape", ["s"], ["z"],
                                   value=numpy_helper.from_array(np.array([1.0], np.float32))),
                  helper.make_node("Add", ["z", "z"], ["a"]),
                  helper.make_node("ReduceSum", ["a"], ["y"], keepdims=0)], "y", TensorProto.FLOAT)


def range_tile(n: int) -> onnx.ModelProto:
    """Range(0, n, 1) -> Tile x4 -> ReduceMax, all int64."""
    return model([const("st", np.array(0, np.int64)), const("li", np.array(n, np.int64)),
                  const("de", np.array(1, np.int64)), helper.make_node("Range", ["st", "li", "de"], ["r"]),
                  const("reps", np.array([4], np.int64)), helper.make_node("Tile", ["r", "reps"], ["t"]),
                  helper.make_node("ReduceMax", ["t"], ["y"], keepdims=0)], "y", TensorProto.INT64)


def int_expand(rows: int) -> onnx.ModelProto:
    """A one-element int64 constant expanded to [rows, 5000] (once evaluated as shape arithmetic on
    Python objects) -> ReduceSum."""
    return model([const("one", np.array([1], np.int64)), const("shape", np.array([rows, 5000], np.int64)),
                  helper.make_node("Expand", ["one", "shape"], ["e"]),
                  helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)], "y", TensorProto.INT64)


def peak_of(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def largest_param(graph: Any) -> int:
    return max((int(np.asarray(w).size) for w in graph.weights.values()), default=0)


@pytest.mark.parametrize("build, size", [(constant_of_shape, 4000), (range_tile, 10_000_000),
                                         (int_expand, 8000)])
def test_amplifying_folds_stay_graph_nodes(build: Callable[[int], onnx.ModelProto], size: int) -> None:
    m = build(size)
    assert len(m.SerializeToString()) < 400
    graph, peak = peak_of(lambda: load_onnx(m))
    assert peak < PEAK_LIMIT, f"the import traced {peak / 2**20:.0f} MiB"
    assert largest_param(graph) <= 16, "a large folded constant was materialised"
    assert {"expand", "iota"} & {n.op for n in graph.nodes}, [n.op for n in graph.nodes]


def test_rlx_explain_of_an_amplifying_file_stays_cheap(tmp_path: Path) -> None:
    for k, m in enumerate((constant_of_shape(4000), range_tile(10_000_000), int_expand(8000))):
        path = tmp_path / f"amp{k}.onnx"
        path.write_bytes(m.SerializeToString())
        args = ["explain", str(path), "--device", "cpu"]
        res, peak = peak_of(lambda: CliRunner().invoke(cli, args))  # noqa: B023 - called at once
        assert res.exit_code == 0, res.output
        assert peak < PEAK_LIMIT, f"rlx explain traced {peak / 2**20:.0f} MiB on {path.name}"


def test_unfolded_nodes_compute_what_onnxruntime_computes() -> None:
    """With a tiny budget the same models run as graph nodes and match ONNX Runtime."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 40])
    cases = [
        constant_of_shape(3),
        range_tile(50),
        int_expand(3),
        # Range with start and delta, Tile with many repeats (an expand, not a 20-input concat).
        model([const("st", np.array(3, np.int64)), const("li", np.array(100, np.int64)),
               const("de", np.array(7, np.int64)), helper.make_node("Range", ["st", "li", "de"], ["r"]),
               const("reps", np.array([20], np.int64)), helper.make_node("Tile", ["r", "reps"], ["y"])],
              "y", TensorProto.INT64),
        model([const("st", np.array(-1.5, np.float32)), const("li", np.array(9.0, np.float32)),
               const("de", np.array(0.25, np.float32)), helper.make_node("Range", ["st", "li", "de"], ["y"])],
              "y", TensorProto.FLOAT),
        # Broadcasting two constants into a bigger product, added to an input.
        model([const("a", np.arange(3, dtype=np.float32).reshape(3, 1)),
               const("b", np.arange(40, dtype=np.float32).reshape(1, 40)),
               helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node("Add", ["x", "p"], ["y"])],
              "y", TensorProto.FLOAT, [x]),
    ]
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)}
    for m in cases:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        want = sess.run(None, {n: feeds[n] for n in names})[0]
        graph = load_onnx(m, fold_max_elements=8)
        assert largest_param(graph) <= 40, "the amplifying fold was not refused"
        got = Session("cpu").run(graph, {n: feeds[n] for n in names})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        # The default budget folds these small products as before.
        assert Session("cpu").run(load_onnx(m), {n: feeds[n] for n in names})["y"].shape == want.shape


def test_non_amplifying_folds_of_weights_still_fold() -> None:
    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    g = helper.make_graph([helper.make_node("Transpose", ["w"], ["wt"]),
                           helper.make_node("MatMul", ["x", "wt"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = load_onnx(m, fold_max_elements=4)
    assert "transpose" not in {n.op for n in graph.nodes}


def test_an_op_that_must_fold_says_the_budget_is_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # NonZero has no run-time translation: over budget it cannot be imported, and the error says why.
    m = model([const("k", np.ones((10, 10), np.float32)), helper.make_node("NonZero", ["k"], ["y"])],
              "y", TensorProto.INT64)
    assert load_onnx(m).outputs
    monkeypatch.setenv("RLX_ONNX_FOLD_MAX_ELEMENTS", "10")
    with pytest.raises(UnsupportedOnnxError, match="folding") as ei:
        load_onnx(m)
    assert "NonZero" in ei.value.what and "RLX_ONNX_FOLD_MAX_ELEMENTS" in ei.value.fix


def test_total_bytes_budget_and_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each fold is small, but together they exceed the byte budget: the later ones stay graph nodes.
    nodes = [const("s", np.array([1000], np.int64))]
    for i in range(8):
        nodes.append(helper.make_node("ConstantOfShape", ["s"], [f"c{i}"],
                                      value=numpy_helper.from_array(np.array([float(i)], np.float32))))
    nodes.append(helper.make_node("Concat", [f"c{i}" for i in range(8)], ["y"], axis=0))
    m = model(nodes, "y", TensorProto.FLOAT)
    graph = load_onnx(m, fold_max_bytes=10_000)
    assert sum(n.op == "expand" for n in graph.nodes) >= 5
    want = np.repeat(np.arange(8, dtype=np.float32), 1000)
    np.testing.assert_array_equal(Session("cpu").run(graph, {})["y"], want)
    monkeypatch.setenv("RLX_ONNX_FOLD_MAX_BYTES", "lots")
    with pytest.raises(RLXError, match="RLX_ONNX_FOLD_MAX_BYTES"):
        load_onnx(m)
