"""The one constant-folding pass (rlx_core.fold), run by Session.legalize before dispatch."""

from __future__ import annotations

import numpy as np

from rlx_core import GraphBuilder, Session
from rlx_core.fold import FoldBudget, constant_values, fold_constants
from rlx_core.ir.reference import evaluate


def _chain() -> tuple[object, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    g = GraphBuilder("chain")
    x = g.input("x", "f32", (2, 3))
    p = g.param("w", w)
    wt = g.op("transpose", g.exp(p * 0.5), perm=(1, 0))   # mul, exp, transpose: all constant
    g.output(g.relu(x @ wt), "y")                          # matmul reads x: a side input
    return g.build(), w


def test_folds_a_chain_of_constant_nodes() -> None:
    graph, w = _chain()
    folded = fold_constants(graph)
    assert [n.op for n in graph.nodes][:3] == ["mul", "exp", "transpose"]
    assert [n.op for n in folded.nodes] == [n.op for n in graph.nodes][3:]
    assert "w" not in {p.name for p in folded.params}  # no longer read
    mm = folded.nodes[0]
    assert mm.op == "matmul"
    wt = folded.weights[mm.inputs[1]]
    assert wt.dtype == np.float32 and not wt.flags.writeable
    np.testing.assert_array_equal(wt,
                                  np.exp(w.astype(np.float64) * 0.5).astype(np.float32).T)


def test_does_not_fold_nodes_with_side_inputs_or_outputs() -> None:
    g = GraphBuilder("side")
    x = g.input("x", "f32", (3,))
    c = g.param("c", np.ones(3, np.float32))
    g.output(x + c, "a")     # a run-time input
    g.output(g.exp(c), "b")  # a graph output stays a node (a backend computes it)
    graph = g.build()
    folded = fold_constants(graph)
    assert [n.op for n in folded.nodes].count("add") == 1
    assert {o for n in folded.nodes for o in n.outputs} >= set(graph.outputs)
    # Naming an output adds no node: exp computes "b" itself, so it stays for the backend to run.
    assert [n.op for n in folded.nodes] == ["add", "exp"]
    consts, names = constant_values(graph, outputs=True)  # a caller that only reads values
    assert "b" in consts and names == ["exp_0"]  # the exp node (its value is the output "b")


def test_respects_the_budget() -> None:
    g = GraphBuilder("amp")
    x = g.input("x", "f32", (64, 64))
    c = g.param("c", np.ones((1, 1), np.float32))
    big = g.op("expand", c, shape=(64, 64))  # amplifies 1 -> 4096 elements
    g.output(x + big, "y")
    graph = g.build()
    assert len(fold_constants(graph, FoldBudget(1000, 1 << 20, 0)).nodes) == len(graph.nodes)
    assert len(fold_constants(graph, FoldBudget(1 << 20, 100, 0)).nodes) == len(graph.nodes)  # bytes
    assert len(fold_constants(graph, FoldBudget(1 << 20, 1 << 20, 0)).nodes) == len(graph.nodes) - 1


def test_dtype_exact() -> None:
    g = GraphBuilder("dt")
    x = g.input("x", "i32", (3,))
    big = g.param("big", np.array([2**31 - 1, -(2**31), 7], np.int32))
    h = g.param("h", np.array([1.0, 2.0, 3.0], np.float16))
    s = g.op("add", big, big)  # wraps in int32, as a backend does
    third = g.op("div", h, g.param("three", np.full(3, 3.0, np.float16)))  # rounded to f16 once
    g.output(x + s, "a")
    g.output(third.astype("f32") + 0.0, "b")
    graph = g.build()
    folded = fold_constants(graph)
    ws = dict(folded.weights)
    (sv,) = [v for v in ws.values() if v.dtype == np.int32]
    np.testing.assert_array_equal(sv, np.array([-2, 0, 14], np.int32))
    (b,) = [n for n in folded.nodes if n.outputs == ("b",)]  # the output rename reads the folded f32
    bv = ws[b.inputs[0]]
    assert bv.dtype == np.float32  # the value rounded to f16 by div (its dtype), then cast exactly
    np.testing.assert_array_equal(bv, (np.array([1.0, 2.0, 3.0]) / 3.0).astype(np.float16).astype(np.float32))
    x = np.array([1, 2, 3], np.int32)
    for name, v in evaluate(graph, {"x": x}).items():
        np.testing.assert_array_equal(evaluate(folded, {"x": x})[name], v)


def test_results_equal_the_unfolded_graph_on_cpu() -> None:
    graph, _ = _chain()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    folded = fold_constants(graph)
    ref = evaluate(graph, {"x": x})["y"]
    np.testing.assert_allclose(evaluate(folded, {"x": x})["y"], ref, rtol=1e-6, atol=1e-6)
    s = Session("cpu", use_cache=False)
    exe = s.compile(graph)
    assert [n.op for n in exe.program().graph.nodes if n.op in ("exp", "transpose")] == []
    np.testing.assert_allclose(exe.run(x=x)["y"], ref, rtol=1e-5, atol=1e-5)
