"""ConvTranspose against ONNX Runtime on shapes the node suite does not cover: strides with
output_padding, groups, dilations, crops beyond the kernel, 1-D, and a run-time weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core import Session  # noqa: E402
from rlx_core.frontends.onnx import load_onnx  # noqa: E402

CASES = [
    # (input shape, weight shape, attrs)
    ((2, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 2], output_padding=[1, 1], pads=[1, 0, 1, 1])),
    ((1, 4, 4, 4), (4, 2, 3, 2), dict(strides=[3, 2], group=2, dilations=[2, 1])),
    ((1, 2, 6, 6), (2, 2, 2, 2), dict(strides=[2, 2], pads=[3, 3, 2, 2])),
    ((1, 2, 5, 5), (2, 3, 4, 4), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ((3, 2, 7), (2, 4, 5), dict(strides=[3], output_padding=[2], pads=[1, 2])),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("runtime_weight", [False, True])
def test_conv_transpose_matches_onnxruntime(tmp_path: Path, case: int, runtime_weight: bool) -> None:
    xs, ws, attrs = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.normal(size=xs).astype(np.float32)
    w = rng.normal(size=ws).astype(np.float32)
    b = rng.normal(size=(ws[1] * attrs.get("group", 1),)).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))]
    if runtime_weight:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(ws)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "ct", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   None)], inits)
    path = tmp_path / "ct.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = {"x": x, **({"w": w} if runtime_weight else {})}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = Session("cpu", use_cache=False).compile(load_onnx(path)).run(feeds)
    got = out[next(iter(out))] if isinstance(out, dict) else out[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
