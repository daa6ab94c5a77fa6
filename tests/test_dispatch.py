"""The dispatch contract: native, common_ir, rewritten, and failure without fallback."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.dispatch import COMMON_IR, NATIVE, REWRITTEN
from rlx_core.dtypes import DType
from rlx_core.errors import DispatchError
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(7)


def _mlp(dtype: str = "f32") -> object:
    g = GraphBuilder("mlp")
    x = g.input("x", dtype, ("batch", 8))
    w1 = g.param("w1", RNG.standard_normal((8, 16)).astype(DType.parse(dtype).np))
    b1 = g.param("b1", RNG.standard_normal(16).astype(w1.dtype.np))
    w2 = g.param("w2", RNG.standard_normal((16, 4)).astype(w1.dtype.np))
    h = g.relu(x @ w1 + b1)
    g.output(g.softmax(h @ w2), "probs")
    return g.build()


def _paths(report: object) -> dict[str, str]:
    return {e.node: e.path for e in report.entries}  # type: ignore[attr-defined]


@pytest.mark.parametrize("device", ["cpu", "whole"])
def test_three_paths_and_numbers(device: str) -> None:
    graph = _mlp()
    exe = Session(device, use_cache=False, fusion=False).compile(graph)
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    out = exe.run(x=x)["probs"]
    want = evaluate(graph, {"x": x})["probs"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    paths = _paths(exe.report)
    assert paths["matmul_0"] == NATIVE
    # rlx-cpu runs softmax natively; the test backend only through the core decomposition. Naming
    # the output renamed the softmax's value, not its node: no extra node, the node keeps its name.
    assert "reshape" not in graph.op_counts()
    assert paths["softmax_0"] == (NATIVE if device == "cpu" else COMMON_IR)
    if device == "whole":
        # The test backend only adds equal shapes: the bias broadcast is materialised (rewritten).
        assert paths["add_0"] == REWRITTEN
        assert "materialize_broadcast" in {e.via for e in exe.report.entries}
    else:
        assert paths["add_0"] == NATIVE


def test_f16_is_rewritten_to_f32_on_cpu() -> None:
    graph = _mlp("f16")
    exe = Session("cpu", use_cache=False).compile(graph)
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    out = exe.run(x=x)["probs"]
    want = evaluate(graph, {"x": x})["probs"]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-2, atol=2e-3)
    entries = {e.node: e for e in exe.report.entries}
    assert entries["matmul_0"].path == REWRITTEN and entries["matmul_0"].via == "compute_f16_in_f32"
    assert entries["matmul_0"].kernels == ("cpu.cast", "cpu.cast", "cpu.matmul", "cpu.cast")


def test_unsupported_variant_fails_listing_every_node_without_fallback() -> None:
    g = GraphBuilder("bad")
    x = g.input("x", "f32", (4,))
    i = g.input("i", "i32", (4,))
    y = g.sin(x)  # the test backend has no sin
    z = g.cos(y)  # nor cos
    g.output(z)
    g.output(i + i)  # nor integer add
    with pytest.raises(DispatchError) as e:
        Session("whole", use_cache=False).compile(g.build())
    err = e.value
    assert [il.node for il in err.illegal] == ["sin_0", "cos_0", "add_0"]
    msg = str(err)
    assert "3 node(s)" in msg and "whole:0" in msg
    assert "sin(f32[4]) -> f32[4]" in msg and "add(i32[4], i32[4]) -> i32[4]" in msg
    assert "has no kernel for 'sin'" in msg
    assert "whole.add accepts f32, f64; got i32, i32" in msg
    assert "never falls back" in msg


def test_failure_lists_what_each_path_tried() -> None:
    g = GraphBuilder("gelu")
    x = g.input("x", "f32", (4,))
    g.output(g.gelu(x))  # decomposes to erf, which the test backend lacks
    with pytest.raises(DispatchError) as e:
        Session("whole", use_cache=False).compile(g.build())
    tried = e.value.illegal[0].tried
    assert any(t.startswith("decomposition core.gelu") and "erf" in t for t in tried), tried


def test_no_silent_device_fallback_even_when_cpu_could_run_it() -> None:
    g = GraphBuilder("sin")
    x = g.input("x", "f32", (4,))
    g.output(g.sin(x))
    assert Session("cpu", use_cache=False).compile(g.build()) is not None
    with pytest.raises(DispatchError):
        Session("whole", use_cache=False).compile(g.build())


def test_multi_device_placement_reports_every_transfer() -> None:
    g = GraphBuilder("mix")
    x = g.input("x", "f32", (2, 4))
    w = g.param("w", RNG.standard_normal((4, 3)).astype(np.float32))
    g.output(g.exp(g.sin(x @ w)), "z")
    graph = g.build()
    exe = Session("whole,cpu", use_cache=False).compile(graph)
    devices = {e.node: e.device for e in exe.report.entries}
    assert devices == {"matmul_0": "whole:0", "sin_0": "cpu:0", "exp_0": "whole:0"}  # exp_0 computes z
    moves = {(t.value, t.src, t.dst) for t in exe.report.transfers}
    assert moves == {("matmul_0", "whole:0", "cpu:0"), ("sin_0", "cpu:0", "whole:0")}
    xv = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run(x=xv)["z"], evaluate(graph, {"x": xv})["z"], rtol=1e-5)


def test_report_text_and_json() -> None:
    exe = Session("cpu", use_cache=False).compile(_mlp())
    exe.run(x=np.zeros((2, 8), np.float32))
    text = exe.report.to_text()
    assert "compile-ready: yes" in text and "softmax_0" in text and "cpu.softmax" in text
    js = exe.report.to_json()
    assert js["counts"]["native"] >= 3 and js["nodes"][0]["kernels"] == ["cpu.matmul"]
    assert js["estimated_seconds"]["total"] > 0
    assert js["memory"]["arena_bytes"] <= js["memory"]["naive_bytes"]


def test_dispatch_report_env_prints(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                    ) -> None:
    monkeypatch.setenv("RLX_DISPATCH_REPORT", "1")
    g = GraphBuilder("small")
    x = g.input("x", "f32", (2,))
    g.output(x * x)
    Session("cpu", use_cache=False).compile(g.build())
    assert "Dispatch report: graph 'small'" in capsys.readouterr().err


def test_costs_positive_and_growing() -> None:
    from rlx_core.cost import rank_devices

    def mm(n: int) -> object:
        g = GraphBuilder("mm")
        a = g.input("a", "f32", (n, n))
        g.output(a @ a)
        return g.build()

    small = Session("cpu", use_cache=False).plan(mm(8)).total_seconds
    big = Session("cpu", use_cache=False).plan(mm(512)).total_seconds
    assert 0 < small < big
    ranked = rank_devices(mm(64), ["cpu", "whole"])
    assert ranked[0].device == "cpu" and ranked[1].seconds is not None


def test_fastest_device_skips_backends_that_cannot_compile() -> None:
    from rlx_core.cost import fastest_device, rank_devices

    g = GraphBuilder("sin")
    x = g.input("x", "f32", (4,))
    g.output(g.sin(x))
    graph = g.build()
    ranked = {e.device: e for e in rank_devices(graph, ["whole", "cpu"])}
    assert ranked["whole"].seconds is None and "sin" in ranked["whole"].error
    assert fastest_device(graph, ["whole", "cpu"]) == "cpu"


def test_plugin_decomposition_and_cost_hooks(make_plugin: object) -> None:
    """A plugin's own decomposition is preferred, and its cost hook overrides the roofline."""
    from _plugintools import plugin_source

    src = plugin_source("decomp") + '''
from rlx_core.records import Decomposition

def _double(b, ins, attrs):
    return [ins[0] + ins[0]]

@hookimpl
def rlx_decompositions():
    return [Decomposition(op="relu", name="decomp.relu_as_double", expand=_double)]

@hookimpl
def rlx_kernel_cost(claim, variant, caps):
    return 0.5
'''
    make_plugin("rlx-decomp", "decomp", src)  # type: ignore[operator]
    from rlx_core._hub import Hub

    g = GraphBuilder("r")
    x = g.input("x", "f32", (3,))
    g.output(g.op("relu", x))
    exe = Session("decomp", hub=Hub(), use_cache=False).compile(g.build())
    (entry,) = exe.report.entries
    assert entry.path == COMMON_IR and entry.via == "decomp.relu_as_double" and entry.seconds == 0.5


def test_fusion_groups_are_reported_and_exact() -> None:
    graph = _mlp()
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    exe = Session("cpu", use_cache=False).compile(graph)
    out = exe.run(x=x)["probs"]
    np.testing.assert_allclose(out, evaluate(graph, {"x": x})["probs"], rtol=1e-5, atol=1e-6)
    assert ["add_0", "maximum_0"] in exe.report.fused
    entries = {e.node: e for e in exe.report.entries}
    assert entries["add_0"].path == NATIVE and entries["add_0"].kernels == ("cpu.fused_elementwise",)
    assert entries["maximum_0"].kernels == ("cpu.fused_elementwise",)
    g = GraphBuilder("gelu")
    xg = g.input("x", "f32", (4, 6))
    g.output(g.gelu(xg * 2.0))
    gexe = Session("cpu", use_cache=False).compile(g.build())
    (gelu,) = [e for e in gexe.report.entries if e.op == "gelu"]
    assert gelu.path == COMMON_IR and gelu.kernels == ("cpu.fused_elementwise",)  # decomposed, then fused
    assert f"fused: {len(exe.report.fused)} groups" in exe.report.to_text()
    # A backend that does not claim fused kernels keeps the unfused graph.
    whole = Session("whole", use_cache=False).compile(graph)
    assert whole.report.fused == [] and "add_0" in {e.node for e in whole.report.entries}
