"""The recurrent ops ``lstm_scan`` / ``gru_scan`` (``rlx_core.ir.ops.recurrent``): what the ONNX
importer emits for LSTM and GRU layers, rlx-cpu's fused kernels, and their decomposition.

* ONNX LSTM/GRU files (forward, reverse, bidirectional, layout 1, initial states, no bias,
  linear_before_reset, peepholes) become one scan node a layer, run natively on rlx-cpu and
  match ONNX Runtime (onnx's reference evaluator for layout 1, which ONNX Runtime refuses).
* The decomposition (the per-step ops every other backend runs) gives the float64 reference's
  numbers when evaluated op by op, and runs on rlx-wasm (``common_ir``), which claims no scan.
* What the ops do not define (RNN, other activations) is still unrolled, and the importer's
  switch ``SCAN_OPS = False`` restores the unrolled form for every layer with the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from test_onnx_rnn import rnn_model  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.errors import BackendNotFoundError, ShapeError  # noqa: E402
from rlx_core.frontends import onnx_rnn  # noqa: E402
from rlx_core.frontends.onnx import load_onnx  # noqa: E402
from rlx_core.ir.builder import GraphBuilder  # noqa: E402
from rlx_core.ir.ops.recurrent import gru_reference, lstm_reference  # noqa: E402
from rlx_core.ir.reference import evaluate  # noqa: E402
from rlx_core.ir.schema import REGISTRY  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

SCANS = ("lstm_scan", "gru_scan")


@pytest.fixture(autouse=True)
def _fresh_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def _want(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if any(a.name == "layout" and a.i == 1 for a in model.graph.node[0].attribute):
        return list(ReferenceEvaluator(model).run(None, feeds))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _run(model: Any, feeds: dict[str, np.ndarray], device: str = "cpu",
         paths: dict[str, str] | None = None) -> list[np.ndarray]:
    """Outputs on ``device``; ``paths``: the dispatch path every scan node must take."""
    graph = load_onnx(model)
    exe = Session(device).compile(graph)
    got = exe.run(feeds)
    if paths is not None:
        assert exe.report is not None
        taken = {e.op: e.path for e in exe.report.entries if e.op in SCANS}
        assert taken == paths, exe.report.to_text()
    return [got[name] for name in graph.outputs]


def _ops(model: Any) -> set[str]:
    return {n.op for n in load_onnx(model).nodes}


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {i}: {g.shape} != {w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


# -- the importer emits one scan a direction; rlx-cpu runs it natively ------------------------------

@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_scan_matches_onnxruntime(op: str, direction: str, layout: int) -> None:
    model, feeds = rnn_model(op, direction=direction, layout=layout, initial=layout == 0, seed=layout + 3,
                             **({"linear_before_reset": 1} if op == "GRU" else {}))
    scan = f"{op.lower()}_scan"
    nodes = [n for n in load_onnx(model).nodes if n.op == scan]
    assert [n.attrs["direction"] for n in nodes] == [direction]
    _close(_run(model, feeds, paths={scan: "native"}), _want(model, feeds))


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_gru_reset_modes_and_biases(lbr: int, bias: bool) -> None:
    # weights as graph inputs (no bias): the kernel lays R out again every run instead of once
    model, feeds = rnn_model("GRU", direction="bidirectional", initial=True, bias=bias,
                             weights_as_inputs=not bias, linear_before_reset=lbr)
    node = next(n for n in load_onnx(model).nodes if n.op == "gru_scan")
    # only linear_before_reset=1 keeps the candidate's recurrent bias out of the input projection
    assert len(node.inputs) == (4 if lbr and bias else 3)
    _close(_run(model, feeds, paths={"gru_scan": "native"}), _want(model, feeds))


@pytest.mark.parametrize("peephole", [True, False])
def test_lstm_peepholes_no_bias_weights_as_inputs(peephole: bool) -> None:
    model, feeds = rnn_model("LSTM", direction="bidirectional", peephole=peephole, initial=True, bias=False,
                             weights_as_inputs=True)
    node = next(n for n in load_onnx(model).nodes if n.op == "lstm_scan")
    assert len(node.inputs) == (5 if peephole else 4)
    _close(_run(model, feeds, paths={"lstm_scan": "native"}), _want(model, feeds))


def test_one_step_one_row_and_only_final_states() -> None:
    model, feeds = rnn_model("LSTM", seq=1, outputs=("", "Y_h", "Y_c"), initial=True)
    feeds["X"] = feeds["X"][:1]
    _close(_run(model, feeds, paths={"lstm_scan": "native"}), _want(model, feeds))


def test_saturated_gates_and_nan() -> None:
    """Pre-activations of +-40 saturate every gate (an exp without range reduction overflows);
    a NaN in one batch row reaches that row's later steps only (as in onnx's reference)."""
    model, feeds = rnn_model("GRU", linear_before_reset=1, initial=True)
    feeds["X"] = (feeds["X"] * 40).astype(np.float32)
    _close(_run(model, feeds, paths={"gru_scan": "native"}), _want(model, feeds))
    feeds["X"][2, 1, 0] = np.nan
    # ONNX Runtime's clamped gate functions turn NaN into numbers; onnx's reference keeps it
    got, want = _run(model, feeds), list(ReferenceEvaluator(model).run(None, feeds))
    assert np.isnan(got[0][2:, 0, 1]).all() and not np.isnan(got[0][:2]).any() and \
        not np.isnan(got[0][:, :, [0, 2]]).any()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g[~np.isnan(g)], w[~np.isnan(w)], rtol=1e-5, atol=1e-5)


# -- what stays unrolled, and the switch back to the unrolled form ----------------------------------

def test_rnn_and_other_activations_are_unrolled() -> None:
    model, feeds = rnn_model("RNN")
    assert not _ops(model) & set(SCANS)
    model, feeds = rnn_model("LSTM", activations=["Sigmoid", "Tanh", "Relu"])
    assert not _ops(model) & set(SCANS)
    _close(_run(model, feeds), _want(model, feeds))


def test_unrolled_switch_gives_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = rnn_model("LSTM", direction="bidirectional", initial=True, peephole=True)
    fused = _run(model, feeds)
    monkeypatch.setattr(onnx_rnn, "SCAN_OPS", False)
    assert not _ops(model) & set(SCANS)
    _close(_run(model, feeds), fused)


# -- the decomposition ----------------------------------------------------------------------------

def _scan_inputs(op: str, t: int, b: int, h: int, extra: bool, seed: int, nd: int = 1
                 ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    gates = 4 if op == "lstm_scan" else 3
    ins = {"xw": rng.uniform(-2, 2, (t, b, nd * gates * h)),
           "r": rng.standard_normal((nd, gates * h, h)) / np.sqrt(h), "h0": rng.uniform(-1, 1, (nd, b, h))}
    if op == "lstm_scan":
        ins["c0"] = rng.uniform(-1, 1, (nd, b, h))
    if extra:
        n = (3 if op == "lstm_scan" else 1) * h
        ins["p" if op == "lstm_scan" else "rb"] = rng.uniform(-0.5, 0.5, (nd, n))
    return ins


@pytest.mark.parametrize("op,attrs,extra", [
    ("lstm_scan", {}, False), ("lstm_scan", {"direction": "reverse"}, True),
    ("lstm_scan", {"direction": "bidirectional"}, True),
    ("gru_scan", {"linear_before_reset": False}, True), ("gru_scan", {"linear_before_reset": True}, True),
    ("gru_scan", {"linear_before_reset": True, "direction": "bidirectional"}, False)])
def test_decomposition_is_the_reference(op: str, attrs: dict[str, Any], extra: bool) -> None:
    """The per-step ops the decomposition writes, evaluated op by op in float64, give the op's own
    reference (and both follow the equations of the module doc: checked against ORT above)."""
    ins = _scan_inputs(op, 4, 3, 5, extra, seed=len(attrs), nd=2 if "bidirectional" in attrs.values() else 1)
    b = GraphBuilder("dec")
    xs = [b.input(n, "f64", a.shape) for n, a in ins.items()]
    schema = REGISTRY.get(op)
    outs = schema.decompose(b, xs, schema.check_attrs(attrs, "test"))
    for o in outs:
        b.output(o)
    graph = b.build()
    assert not {n.op for n in graph.nodes} & set(SCANS)
    got = evaluate(graph, ins)
    want = schema.reference(list(ins.values()), schema.check_attrs(attrs, "test"))
    for name, w in zip(graph.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-12, atol=1e-12)


def test_references_by_hand() -> None:
    """One step of each reference written out from ONNX's equations (the gate orders i, o, f, c and
    z, r, h are where a slip would go unnoticed by comparing two implementations)."""
    ins = {k: v[0] if k != "xw" else v for k, v in _scan_inputs("lstm_scan", 1, 2, 3, True, seed=7).items()}
    xw, r, h0, c0, p = ins["xw"][0], ins["r"], ins["h0"], ins["c0"], ins["p"]
    g = xw + h0 @ r.T
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    i = sig(g[:, 0:3] + p[0:3] * c0)
    f = sig(g[:, 6:9] + p[6:9] * c0)
    c = f * c0 + i * np.tanh(g[:, 9:12])
    h = sig(g[:, 3:6] + p[3:6] * c) * np.tanh(c)
    y, h_last, c_last = lstm_reference(ins["xw"], r, h0, c0, p, False)
    np.testing.assert_allclose(y[0], h)
    np.testing.assert_allclose(h_last, h)
    np.testing.assert_allclose(c_last, c)
    ins = {k: v[0] if k != "xw" else v for k, v in _scan_inputs("gru_scan", 1, 2, 3, True, seed=8).items()}
    xw, r, h0, rb = ins["xw"][0], ins["r"], ins["h0"], ins["rb"]
    z = sig(xw[:, 0:3] + h0 @ r[0:3].T)
    rg = sig(xw[:, 3:6] + h0 @ r[3:6].T)
    for lbr in (False, True):
        n = np.tanh(xw[:, 6:9] + (rg * (h0 @ r[6:9].T + rb) if lbr else (rg * h0) @ r[6:9].T + rb))
        _, h_last = gru_reference(ins["xw"], r, h0, rb, lbr, False)
        np.testing.assert_allclose(h_last, (1 - z) * n + z * h0)


def _wasm() -> str | None:
    """Why rlx-wasm cannot run here, or None."""
    try:
        s = Session("wasm", use_cache=False)
    except BackendNotFoundError as e:
        return f"rlx-wasm: {e.what}"
    return None if s.device.available else f"rlx-wasm: {s.device.reason}"


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_decomposition_runs_where_the_scan_is_not_claimed(op: str) -> None:
    """rlx-wasm claims neither scan: it runs the decomposition (common_ir) with ORT's numbers."""
    why = _wasm()
    if why:
        pytest.skip(why)
    model, feeds = rnn_model(op, direction="bidirectional", initial=True,
                             **({"linear_before_reset": 1} if op == "GRU" else {"peephole": True}))
    _close(_run(model, feeds, "wasm", paths={f"{op.lower()}_scan": "common_ir"}), _want(model, feeds))


# -- shape errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes,attrs,match", [
    ([(3, 2, 16), (1, 16, 3), (1, 2, 4), (1, 2, 4)], {}, r"r has shape \[1, 16, 3\], not \[D, 4\*H, H\]"),
    ([(3, 2, 16), (1, 16, 4), (1, 2, 4), (1, 2, 4)], {"direction": "bidirectional"}, r"with D = 2"),
    ([(3, 2, 12), (1, 16, 4), (1, 2, 4), (1, 2, 4)], {}, r"xw has shape \[3, 2, 12\], not \[T, B, 16\]"),
    ([(0, 2, 16), (1, 16, 4), (1, 2, 4), (1, 2, 4)], {}, r"sequence is empty"),
    ([(3, 2, 16), (1, 16, 4), (1, 1, 4), (1, 2, 4)], {}, r"h0 has shape \[1, 1, 4\]"),
    ([(3, 2, 16), (1, 16, 4), (1, 2, 4), (1, 2, 4), (4,)], {}, r"p has shape \[4\], not \[1, 12\]"),
])
def test_shape_errors_say_what_is_wrong(shapes: list[tuple[int, ...]], attrs: dict[str, Any], match: str
                                       ) -> None:
    b = GraphBuilder("bad")
    xs = [b.input(f"x{i}", "f32", s) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=match) as e:
        b.op("lstm_scan", *xs, **attrs)
    assert e.value.fix


def test_zoo_shaped_layer_matches_onnxruntime_at_batch_8() -> None:
    """The zoo's size (hidden 24, input 16, 8 steps) at batch 8: every gate loop of the kernel runs
    full vector widths and remainders."""
    rng = np.random.default_rng(5)
    hid, inp, seq, batch = 24, 16, 8, 8
    w = rng.standard_normal((2, 4 * hid, inp)).astype(np.float32) * 0.3
    r = rng.standard_normal((2, 4 * hid, hid)).astype(np.float32) * 0.3
    bias = rng.standard_normal((2, 8 * hid)).astype(np.float32) * 0.3
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=hid,
                            direction="bidirectional")
    graph = helper.make_graph([node], "zoo_lstm", [helper.make_tensor_value_info("X", 1, [seq, batch, inp])],
                              [helper.make_tensor_value_info(o, 1, None) for o in ("Y", "Y_h", "Y_c")],
                              [numpy_helper.from_array(a, n) for n, a in (("W", w), ("R", r), ("B", bias))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    feeds = {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32)}
    _close(_run(model, feeds, paths={"lstm_scan": "native"}), _want(model, feeds))



@pytest.mark.parametrize("op,attrs", [("lstm_scan", {"direction": "bidirectional"}),
                                      ("gru_scan", {"linear_before_reset": True, "direction": "reverse"})])
def test_gradient_through_the_decomposition(op: str, attrs: dict[str, Any]) -> None:
    """Autodiff differentiates the scans through their decomposition: the gradient of a loss with
    respect to every operand matches central finite differences of the float64 reference."""
    from rlx_core.autodiff import grad

    ins = _scan_inputs(op, 3, 2, 3, True, seed=11, nd=2 if attrs.get("direction") == "bidirectional" else 1)
    b = GraphBuilder("loss")
    xs = [b.input(n, "f64", a.shape) for n, a in ins.items()]
    outs = b.op(op, *xs, **attrs)
    loss = b.op("reduce_sum", outs[0] * outs[0], axes=(0, 1, 2, 3), keepdims=False) + \
        b.op("reduce_sum", outs[1], axes=(0, 1, 2), keepdims=False)
    b.output(loss, "loss")
    graph = b.build()
    wrt = list(ins)
    got = evaluate(grad(graph, "loss", wrt), ins, round_intermediates=False)

    def f(feeds: dict[str, np.ndarray]) -> float:
        return float(evaluate(graph, feeds, round_intermediates=False)["loss"])

    eps = 1e-6
    for w in wrt:
        fd = np.zeros_like(ins[w])
        for idx in np.ndindex(ins[w].shape):
            plus, minus = ins[w].copy(), ins[w].copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd[idx] = (f({**ins, w: plus}) - f({**ins, w: minus})) / (2 * eps)
        np.testing.assert_allclose(got[f"grad_{w}"], fd, rtol=1e-5, atol=1e-7, err_msg=w)
