"""Reshape pairs that undo each other (rlx_core.reshapes), run by Session.legalize with constant folding."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.graph import Graph
from rlx_core.ir.reference import evaluate
from rlx_core.reshapes import cancel_reshapes


def _conv1d_net(batch: int = 2) -> Graph:
    """Two Conv1d + ReLU + MaxPool1d blocks, written as the ONNX importer writes them (2-D ops on
    (N, C, 1, L) with reshapes around each)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder("conv1d")
    x = g.input("x", "f32", (batch, 3, 40))
    h = x
    for cin, cout in ((3, 8), (8, 5)):
        w = g.param(f"w{cout}", rng.standard_normal((cout, cin, 1, 3)).astype(np.float32))
        b = g.param(f"b{cout}", rng.standard_normal(cout).astype(np.float32))
        h4 = g.op("reshape", h, shape=(batch, cin, 1, h.shape[2]))
        y = g.op("conv2d_bias", h4, w, b, strides=(1, 1), pads=(0, 1, 0, 1), dilations=(1, 1), groups=1)
        y = g.op("reshape", y, shape=(batch, cout, y.shape[3]))
        y = g.relu(y) * 0.5 + 0.25                                  # elementwise with scalar operands
        y = g.op("reshape", y, shape=(batch, cout, 1, y.shape[2]))
        p = g.op("max_pool2d", y, kernel=(1, 2), strides=(1, 2), pads=(0, 0, 0, 0))
        h = g.op("reshape", p, shape=(batch, cout, p.shape[3]))
    g.output(h, "y")
    return g.build()


def _feed(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}


def test_conv1d_blocks_lose_their_inner_reshapes_and_compute_the_same() -> None:
    g = _conv1d_net()
    out = cancel_reshapes(g)
    ops = [n.op for n in out.nodes]
    # Only the first reshape (to 4-D) and the last (to the 3-D output) remain.
    assert ops.count("reshape") == 2 and ops[0] == "reshape" and ops[-1] == "reshape"
    assert [o for o in ops if o != "reshape"] == [n.op for n in g.nodes if n.op != "reshape"]
    feed = _feed(g)
    want = evaluate(g, feed)["y"]
    got = evaluate(out, feed)["y"]
    np.testing.assert_array_equal(got, want)  # the same ops on the same elements
    assert out.types["y"] == g.types["y"]


def test_session_runs_the_simplified_graph() -> None:
    g = _conv1d_net(batch=1)
    feed = _feed(g)
    got = Session("cpu", use_cache=False).compile(g).run(feed)["y"]
    want = evaluate(g, feed, round_intermediates=False)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _pair(*, other_reader: bool = False, output_mid: bool = False, vector: bool = False) -> Graph:
    g = GraphBuilder("pair")
    x = g.input("x", "f32", (2, 3, 4))
    r = g.op("reshape", x, shape=(2, 12))
    c = g.param("c", np.full((12,), 2.0, np.float32)) if vector else 2.0
    m = g.mul(r, c) if vector else r * c
    back = g.op("reshape", m, shape=(2, 3, 4))
    g.output(g.exp(back), "y")
    if other_reader:
        g.output(g.exp(r), "r")
    if output_mid:
        g.output(m, "m")
    return g.build()


def test_a_pair_with_an_elementwise_op_between_cancels() -> None:
    out = cancel_reshapes(_pair())
    assert [n.op for n in out.nodes] == ["mul", "exp"]
    assert out.types[out.nodes[0].outputs[0]].shape == (2, 3, 4)


@pytest.mark.parametrize("kw", [{"other_reader": True}, {"output_mid": True}, {"vector": True}],
                         ids=["reshaped-value-read-elsewhere", "middle-is-an-output", "non-scalar-operand"])
def test_pairs_that_must_stay(kw: dict[str, bool]) -> None:
    g = _pair(**kw)
    out = cancel_reshapes(g)
    assert [n.op for n in out.nodes].count("reshape") == 2
    feed = _feed(g)
    for k, v in evaluate(g, feed).items():
        np.testing.assert_array_equal(evaluate(out, feed)[k], v)


def test_a_graph_output_keeps_its_name() -> None:
    g = GraphBuilder("out")
    x = g.input("x", "f32", (2, 6))
    y = g.op("reshape", g.op("reshape", x, shape=(12,)), shape=(2, 6))
    g.output(y, "y")
    graph = g.build()
    out = cancel_reshapes(graph)
    assert out.outputs == ("y",)
    feed = _feed(graph)
    np.testing.assert_array_equal(evaluate(out, feed)["y"], feed["x"])


def test_nothing_to_do_returns_the_same_graph() -> None:
    g = GraphBuilder("plain")
    x = g.input("x", "f32", (2, 6))
    g.output(g.exp(g.op("reshape", x, shape=(12,))), "y")
    graph = g.build()
    assert cancel_reshapes(graph) is graph
