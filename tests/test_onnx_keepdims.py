"""ONNX ``keepdims`` values other than 0 and 1 follow ONNX Runtime (issue 14, item 7).

ORT keeps the reduced axes only for ``keepdims == 1``; 2, -1 or 7 drop them like 0. The importer
used ``bool(keepdims)`` (2 kept them), and onnx's reference evaluator, which folds constant nodes,
does too; both paths are compared with ORT here.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7.0

#: (op, opset, attributes); axes as an input from ReduceSum-13 / the other reductions' opset 18.
CASES = [("ReduceSum", 13, {}), ("ReduceMean", 13, {"axes": [1]}), ("ReduceMean", 18, {}),
         ("ReduceMax", 13, {"axes": [1]}), ("ReduceLogSumExp", 13, {"axes": [1]}), ("ReduceL2", 18, {}),
         ("ArgMax", 13, {"axis": 1}), ("ArgMin", 13, {"axis": 1})]


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def reduce_model(op: str, opset: int, attrs: dict, keepdims: int, constant: bool) -> onnx.ModelProto:
    inits = []
    ins = ["x"]
    if (op == "ReduceSum" and opset >= 13) or opset >= 18:
        ins.append("ax")
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax"))
    out_type = TensorProto.INT64 if op.startswith("Arg") else TensorProto.FLOAT
    nodes = [helper.make_node(op, ins, ["y"], keepdims=keepdims, **attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])]
    if constant:  # every input a constant: the importer folds the node
        inits.append(numpy_helper.from_array(X, "x"))
        inputs = []
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", out_type, None)],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("constant", [False, True], ids=["runtime", "folded"])
@pytest.mark.parametrize("keepdims", [2, -1, 7, 0, 1])
@pytest.mark.parametrize("op, opset, attrs", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_keepdims_matches_onnxruntime(op: str, opset: int, attrs: dict, keepdims: int,
                                      constant: bool) -> None:
    m = reduce_model(op, opset, attrs, keepdims, constant)
    feeds = {} if constant else {"x": X}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = Session("cpu").run(load_onnx(m), feeds)["y"]
    assert got.shape == want.shape, f"{op} keepdims={keepdims}: RLX {got.shape}, ORT {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-5)
