"""ONNX RNN / GRU / LSTM (``rlx_core.frontends.onnx_rnn``): unrolled over a static sequence length.

Small onnx.helper models with random weights (initializers, so the weights are constants as in
exported models, and graph inputs for the node-suite path), run on rlx-cpu and compared with ONNX
Runtime (onnx's reference evaluator for layout 1, which ONNX Runtime refuses). What cannot be
translated exactly must raise UnsupportedOnnxError naming the op and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import (  # noqa: E402
    SymbolicShapeError,
    UnsupportedOnnxError,
    coverage,
    load_onnx,
)
from rlx_core.runtime import Session  # noqa: E402

F32 = TensorProto.FLOAT
SEQ, BATCH, INP, HID = 5, 3, 4, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def rnn_model(op: str, *, direction: str = "forward", layout: int = 0, bias: bool = True,
              initial: bool = False, peephole: bool = False, seq_lens: np.ndarray | None = None,
              weights_as_inputs: bool = False, seq: Any = SEQ, opset: int = 14,
              outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), seed: int = 0,
              **attrs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    arrays: dict[str, np.ndarray] = {
        "W": rng.standard_normal((nd, g * HID, INP)).astype(np.float32) * 0.5,
        "R": rng.standard_normal((nd, g * HID, HID)).astype(np.float32) * 0.5}
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        arrays["B"] = rng.standard_normal((nd, 2 * g * HID)).astype(np.float32) * 0.5
        names[3] = "B"
    if seq_lens is not None:
        arrays["L"] = seq_lens.astype(np.int32)
        names[4] = "L"
    state = (BATCH, nd, HID) if layout else (nd, BATCH, HID)
    if initial:
        arrays["H0"] = rng.standard_normal(state).astype(np.float32)
        names[5] = "H0"
        if op == "LSTM":
            arrays["C0"] = rng.standard_normal(state).astype(np.float32)
            names[6] = "C0"
    if peephole:
        arrays["P"] = rng.standard_normal((nd, 3 * HID)).astype(np.float32) * 0.5
        names[7] = "P"
    while names and not names[-1]:
        names.pop()
    outs = [o for o in outputs if op == "LSTM" or o != "Y_c"]
    node = helper.make_node(op, names, outs, direction=direction, hidden_size=HID,
                            **({"layout": layout} if layout else {}), **attrs)
    xshape = [BATCH, seq, INP] if layout else [seq, BATCH, INP]
    feeds = {"X": rng.standard_normal([SEQ if isinstance(d, str) else d for d in xshape]).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("X", F32, xshape)]
    inits = []
    for n, a in arrays.items():
        if weights_as_inputs and n != "L":
            inputs.append(helper.make_tensor_value_info(n, F32, list(a.shape)))
            feeds[n] = a
        else:
            inits.append(numpy_helper.from_array(a, n))
    graph = helper.make_graph([node], "rnn", inputs,
                              [helper.make_tensor_value_info(o, F32, None) for o in outs if o],
                              initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m, feeds


def check(model: Any, feeds: dict[str, np.ndarray]) -> None:
    graph = load_onnx(model)
    got = Session("cpu").compile(graph).run(feeds)
    if any(a.name == "layout" and a.i == 1 for a in model.graph.node[0].attribute):
        # ONNX Runtime refuses layout 1 ("batchwise recurrent operations are not supported")
        want = ReferenceEvaluator(model).run(None, feeds)
    else:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
    for name, ref in zip(graph.outputs, want):
        assert got[name].shape == ref.shape, f"{name}: {got[name].shape} != {ref.shape}"
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_matches_onnxruntime(op: str, direction: str, layout: int) -> None:
    check(*rnn_model(op, direction=direction, layout=layout, initial=layout == 1, seed=len(direction)))


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr: int) -> None:
    check(*rnn_model("GRU", direction="bidirectional", initial=True, linear_before_reset=lbr))


def test_lstm_peepholes_and_weights_as_inputs() -> None:
    check(*rnn_model("LSTM", direction="bidirectional", peephole=True, initial=True, weights_as_inputs=True))


def test_no_bias_only_some_outputs_opset7_and_full_sequence_lens() -> None:
    check(*rnn_model("GRU", bias=False, outputs=("", "Y_h"), opset=7))
    check(*rnn_model("LSTM", outputs=("Y",), seq_lens=np.full(BATCH, SEQ)))
    check(*rnn_model("RNN", activations=["Relu"], opset=22))


@pytest.mark.parametrize("kwargs,match", [
    ({"seq_lens": np.array([SEQ, 2, SEQ])}, r"sequence_lens \[5, 2, 5\] differ"),
    ({"clip": 3.0}, "clip=3.0"),
    ({"input_forget": 1}, "input_forget=1"),
    ({"activations": ["Sigmoid", "Tanh", "Softsign"]}, "'Softsign'"),
])
def test_refusals_name_the_attribute(kwargs: dict[str, Any], match: str) -> None:
    model, _ = rnn_model("LSTM", **kwargs)
    with pytest.raises(UnsupportedOnnxError, match=match) as e:
        load_onnx(model)
    assert "LSTM" in str(e.value) and e.value.fix
    if "seq_lens" not in kwargs:  # attribute refusals are also reported before import
        assert not coverage(model).ok


def test_symbolic_sequence_length_is_refused() -> None:
    model, feeds = rnn_model("GRU", seq="seq")
    with pytest.raises(SymbolicShapeError, match="symbolic sequence length"):
        load_onnx(model)
    check(*rnn_model("GRU", seq=SEQ))  # fixing the size at import is the fix
    graph = load_onnx(model, symbols={"seq": SEQ})
    assert graph.outputs
