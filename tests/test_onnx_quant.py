"""ONNX's quantized operators on real quantized models: ONNX Runtime's own quantization tool makes
them (dynamic: DynamicQuantizeLinear + MatMulInteger; static QDQ; static QOperator: QLinearConv /
QLinearMatMul), and RLX's import must match ONNX Runtime running the same file. The node-level
semantics are covered by the ONNX node suite (tests/test_onnx_node_suite.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core import Session  # noqa: E402
from rlx_core.frontends.onnx import load_onnx  # noqa: E402


def _float_model(path: Path) -> None:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.2, (8 * 6 * 6, 10)).astype(np.float32), "w2")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "qnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [2, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
                              [w1, b1, w2, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


class _Reader(quantization.CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.normal(0, 1, (2, 3, 12, 12)).astype(np.float32)} for _ in range(4)])

    def get_next(self) -> dict | None:
        return next(self.batches, None)


def _quantized(tmp_path: Path, kind: str) -> Path:
    src, dst = tmp_path / "float.onnx", tmp_path / f"{kind}.onnx"
    _float_model(src)
    if kind == "dynamic":
        quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    else:
        fmt = quantization.QuantFormat.QDQ if kind == "qdq" else quantization.QuantFormat.QOperator
        quantization.quantize_static(str(src), str(dst), _Reader(), quant_format=fmt,
                                     activation_type=quantization.QuantType.QUInt8,
                                     weight_type=quantization.QuantType.QInt8, per_channel=kind == "qdq")
    return dst

# (No bias Add after the MatMul: ONNX Runtime's QOperator format would make it the contrib operator
# com.microsoft.QLinearAdd, which is not standard ONNX.)


@pytest.mark.parametrize("kind, ops", [("dynamic", {"DynamicQuantizeLinear", "MatMulInteger"}),
                                       ("qdq", {"QuantizeLinear", "DequantizeLinear"}),
                                       ("qoperator", {"QLinearConv", "QLinearMatMul"})])
def test_quantized_model_matches_onnxruntime(tmp_path: Path, kind: str, ops: set[str]) -> None:
    path = _quantized(tmp_path, kind)
    model = onnx.load(path)
    assert ops <= {n.op_type for n in model.graph.node}, "the quantizer did not emit the operators under test"
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = Session("cpu", use_cache=False).compile(load_onnx(path)).run({"x": x})
    got = got[next(iter(got))] if isinstance(got, dict) else got[0]
    # ORT's integer kernels requantize with fixed-point multipliers; the reference semantics RLX
    # implements may differ by one quantization step on a rounding tie, never more.
    step = float(np.max(np.abs(want))) / 127.0
    assert got.shape == want.shape
    err = float(np.max(np.abs(got - want)))
    assert err <= 2 * step, f"{kind}: max |RLX - ORT| = {err:.4g} (one step {step:.4g})"
    assert np.mean(np.abs(got - want)) <= 0.1 * step
