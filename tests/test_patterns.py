"""The attention pattern pass: written-out scaled dot-product attention becomes one HIR node."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate
from rlx_core.patterns import fuse_attention

RNG = np.random.default_rng(8)
B, H, S, D = 2, 3, 7, 4


def _chain(*, scale: str, bias: bool, kt_from_transpose: bool, leak: bool = False) -> object:
    g = GraphBuilder("att")
    x = g.input("x", "f32", (B, S, H * D))
    q = x.reshape(B, S, H, D).transpose(0, 2, 1, 3)
    if kt_from_transpose:
        kt = (x * 0.5).reshape(B, S, H, D).transpose(0, 2, 3, 1)  # (B, H, D, S) in one transpose
    else:
        kt = g.input("kt", "f32", (B, H, D, S))
    v = (x * 2.0).reshape(B, S, H, D).transpose(0, 2, 1, 3)
    s = g.op("matmul", q, kt)
    if scale == "div":
        s = s / g.param("c", np.float32(2.0))
    elif scale == "mul":
        s = s * g.param("c", np.float32(0.25))
    if bias:
        s = g.input("bias", "f32", (B, 1, 1, S)) + s  # operand order flipped on purpose
    p = g.op("softmax", s, axis=-1)
    g.output(g.op("matmul", p, v).transpose(0, 2, 1, 3).reshape(B, S, H * D), "y")
    if leak:
        g.output(p, "probs")  # the probabilities are needed: nothing may be fused
    return g.build()


def _feed(graph: object) -> dict[str, np.ndarray]:
    return {v.name: RNG.standard_normal(v.type.shape).astype(np.float32)  # type: ignore[attr-defined]
            for v in graph.inputs}  # type: ignore[attr-defined]


@pytest.mark.parametrize("scale", ["div", "mul", "none"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kt_from_transpose", [True, False])
def test_chain_becomes_one_attention_node(scale: str, bias: bool, kt_from_transpose: bool) -> None:
    graph = _chain(scale=scale, bias=bias, kt_from_transpose=kt_from_transpose)
    fused, groups = fuse_attention(graph)
    ops = fused.op_counts()
    assert ops.get("attention") == 1 and "softmax" not in ops and ops.get("matmul", 0) == 0, ops
    assert len(groups) == 1 and len(groups[0]) >= 3
    feed = _feed(graph)
    np.testing.assert_allclose(evaluate(fused, feed)["y"], evaluate(graph, feed)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kt_op", ["mul", "div", "mul-first"])
def test_sqrt_scales_on_q_and_keys_fold_into_the_scale(kt_op: str) -> None:
    """PyTorch's SDPA export scales q and k^T each by scale**0.5 before the matmul: both muls join
    the attention node, and the keys' two transposes (the export's and the kernel's) become one."""
    g = GraphBuilder("sdpa")
    x = g.input("x", "f32", (B, S, H * D))
    q = x.reshape(B, S, H, D).transpose(0, 2, 1, 3) * 0.5
    kt = (x * 0.5).reshape(B, S, H, D).transpose(0, 2, 3, 1)
    if kt_op == "mul":
        kt = kt * 0.5
    elif kt_op == "div":
        kt = kt / g.param("c", np.float32(2.0))
    else:
        kt = g.mul(g.param("c", np.float32(0.5)), kt)
    v = (x * 2.0).reshape(B, S, H, D).transpose(0, 2, 1, 3)
    p = g.op("softmax", g.op("matmul", q, kt), axis=-1)
    g.output(g.op("matmul", p, v).transpose(0, 2, 1, 3).reshape(B, S, H * D), "y")
    graph = g.build()
    fused, groups = fuse_attention(graph)
    ops = fused.op_counts()
    assert ops.get("attention") == 1 and ops.get("matmul", 0) == 0, ops
    att = next(n for n in fused.nodes if n.op == "attention")
    assert att.attrs["scale"] == pytest.approx(0.25)
    # Left: x * 0.5 and x * 2.0 (k's and v's own scalings), the q/k/v/output transposes.
    assert ops.get("mul", 0) == 2 and ops.get("transpose") == 4, ops
    feed = _feed(graph)
    np.testing.assert_allclose(evaluate(fused, feed)["y"], evaluate(graph, feed)["y"], rtol=1e-5, atol=1e-6)


def test_used_intermediates_block_the_rewrite() -> None:
    graph = _chain(scale="div", bias=True, kt_from_transpose=True, leak=True)
    fused, groups = fuse_attention(graph)
    assert groups == [] and fused is graph


def test_accept_can_refuse() -> None:
    graph = _chain(scale="div", bias=True, kt_from_transpose=True)
    fused, groups = fuse_attention(graph, accept=lambda g, n: False)
    assert groups == [] and fused is graph


def test_session_fuses_on_cpu_and_reports_the_group() -> None:
    graph = _chain(scale="div", bias=True, kt_from_transpose=True)
    exe = Session("cpu", use_cache=False).compile(graph)
    assert any(any("softmax" in n for n in grp) for grp in exe.report.fused), exe.report.fused
    assert any(e.kernels == ("cpu.attention",) for e in exe.report.entries)
    feed = _feed(graph)
    np.testing.assert_allclose(exe.run(feed)["y"], evaluate(graph, feed)["y"], rtol=1e-5, atol=1e-6)
    plain = Session("cpu", use_cache=False, fusion=False).compile(graph)
    assert not any(e.kernels == ("cpu.attention",) for e in plain.report.entries)
