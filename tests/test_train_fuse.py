"""rlx-cpu's bind-time fusion (rlx_cpu.train_fuse): the fused train step computes what the unfused
one does, the patterns it is made for are fused, operands planned over the output are not read
after they were overwritten, and inputs can be read in place from the caller's arrays."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core.ir.builder import GraphBuilder
from rlx_core.optim import SGD
from rlx_core.runtime import Session
from rlx_core.train_bench import ResidentTrainer, RlxMLP, init_params, mlp_graph, param_names, thread_limits

pytest.importorskip("rlx_cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    with thread_limits(1):
        yield


def _curve(arch: tuple[int, ...], batch: int, steps: int, monkeypatch: pytest.MonkeyPatch, fuse: bool,
           strided: bool = False) -> tuple[list[float], RlxMLP]:
    monkeypatch.setenv("RLX_CPU_FUSE_BIND", "1" if fuse else "0")
    monkeypatch.setenv("RLX_CPU_WEIGHT_LAYOUT", "1" if fuse else "0")
    rng = np.random.default_rng(1)
    x = rng.random((batch * steps, arch[0]), dtype=np.float32)
    y = rng.integers(0, arch[-1], batch * steps)
    rt = RlxMLP(arch, init_params(arch, seed=2), batch, 0.02, 0.9)
    if strided:  # not the planned layout: the trainer copies the batch in
        xs = np.repeat(x, 2, axis=1)[:, ::2]
        return [rt.step(xs[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
                for i in range(steps)], rt
    return [rt.step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(steps)], rt


@pytest.mark.parametrize("arch", [(40, 16, 5), (40, 24, 12, 5)])
def test_fused_train_step_matches_unfused(arch: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    fused, rf = _curve(arch, 8, 12, monkeypatch, True)
    plain, rp = _curve(arch, 8, 12, monkeypatch, False)
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)
    for (w0, b0), (w1, b1) in zip(rf.params(), rp.params()):
        np.testing.assert_allclose(w0, w1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b0, b1, rtol=1e-5, atol=1e-6)
    names = set(rf.trainer.binding.kernel_names)
    assert {"cpu.gemm_accumulate", "cpu.axpy", "cpu.log_softmax_backward", "cpu.neg_mean_rowdot",
            "cpu.one_hot", "cpu.linear_blas", "cpu.linear_relu"} <= names, names
    assert "cpu.transpose" not in names and "cpu.transpose" in set(rp.trainer.binding.kernel_names)
    assert len(rf.trainer.binding.runs) < len(rp.trainer.binding.runs)
    if len(arch) > 3:
        assert "cpu.relu_backward" in names
    assert rf.trainer.bound_inputs == {"x"}  # the batch is read where the caller keeps it
    views = rf.trainer.binding.views
    for k in range(len(arch) - 1):  # weights, momenta and updates kept column-major
        for v in (f"w{k}", f"w{k}.momentum_buffer", f"w{k}.next"):
            assert views[v].flags.f_contiguous and not views[v].flags.c_contiguous, v
        assert rf.params()[k][0].shape == (arch[k + 1], arch[k])
    assert all(v.flags.c_contiguous for v in rp.trainer.binding.views.values())


def test_column_major_weights_load_and_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = (9, 7, 4)
    rt = RlxMLP(arch, init_params(arch, seed=1), 4, 0.1, 0.9)
    w = np.arange(63, dtype=np.float32).reshape(7, 9)
    rt.trainer.load({"w0": w})
    np.testing.assert_array_equal(rt.trainer.values()["w0"], w)
    assert rt.trainer.values()["w0"].flags.c_contiguous


def test_paired_gemms_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer's dX and dW GEMMs run at once (opt-in) compute what they compute one after the other."""
    arch = (40, 24, 12, 5)
    # The tight memory plan puts each layer's dX and dW GEMMs next to each other (with rlx-cpu's
    # default reuse distance the momentum GEMM runs where the update was instead).
    from rlx_core._hub import reset_hub

    monkeypatch.setenv("RLX_CPU_REUSE_DISTANCE", "0")
    reset_hub()  # devices are probed once per hub
    try:
        plain, _ = _curve(arch, 8, 8, monkeypatch, True)
        monkeypatch.setenv("RLX_CPU_PAIR_MIN_FLOPS", "1")
        with thread_limits(2):
            paired, rt = _curve(arch, 8, 8, monkeypatch, True)
    finally:
        monkeypatch.undo()
        reset_hub()
    np.testing.assert_allclose(paired, plain, rtol=1e-6, atol=1e-7)
    from rlx_cpu.parallel import pool

    if pool().threads > 1:
        assert "cpu.gemm_pair" in rt.trainer.binding.kernel_names


def test_strided_batch_is_copied_in(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = (40, 16, 5)
    a, ra = _curve(arch, 8, 6, monkeypatch, True)
    b, rb = _curve(arch, 8, 6, monkeypatch, True, strided=True)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert rb.trainer.bound_inputs == set()


def test_generic_run_after_bound_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` copies its inputs in and re-points kernels bound to a caller array."""
    arch = (12, 6, 3)
    rt = ResidentTrainer(mlp_graph(arch, init_params(arch), 4), "loss", SGD(lr=0.1, momentum=0.9),
                         param_names(2), fusion=False)
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 12), dtype=np.float32), rng.integers(0, 3, 4)
    prog = rt.binding
    assert prog.bind_input("x", x) and "x" in prog._bound
    feed = {"x": x * 0, "y": y, "step": np.asarray(0, np.int64),
            **{p: np.array(rt.model_graph.weights[p]) for p in rt.params},
            **{s: np.zeros_like(v) for s, v in rt.optimizer.init_state(rt.values()).items()}}
    out = prog.run(feed)
    assert not prog._bound
    ref = Session("cpu").compile(rt.graph).run(feed)
    np.testing.assert_allclose(out["loss"], ref["loss"], rtol=1e-6)


def _run(g: object, feed: dict, fuse: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, tuple]:
    monkeypatch.setenv("RLX_CPU_FUSE_BIND", "1" if fuse else "0")
    exe = Session("cpu", fusion=False).compile(g)
    return exe.run(**feed), exe


@pytest.mark.parametrize("n", [3, 16])
def test_transposed_operand_planned_under_the_output(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``matmul(transpose(X), B)`` with X dead afterwards: the planner may put the product over X,
    and the GEMM must then not read X through the transposed view (the transpose is kept)."""
    b = GraphBuilder("t")
    x = b.input("x", "f32", (n, n))
    w = b.input("w", "f32", (n, n))
    h = b.op("exp", x)
    p = b.op("matmul", b.op("transpose", h, perm=(1, 0)), w)
    q = b.op("matmul", p, w)
    b.output(q + b.op("transpose", p, perm=(1, 0)), "out")
    g = b.build()
    rng = np.random.default_rng(0)
    feed = {"x": rng.random((n, n), dtype=np.float32), "w": rng.random((n, n), dtype=np.float32)}
    fused, _ = _run(g, feed, True, monkeypatch)
    plain, _ = _run(g, feed, False, monkeypatch)
    hh = np.exp(feed["x"])
    pp = hh.T @ feed["w"]
    np.testing.assert_allclose(plain["out"], pp @ feed["w"] + pp.T, rtol=1e-5)
    np.testing.assert_allclose(fused["out"], plain["out"], rtol=1e-5)


def test_momentum_and_axpy_patterns_not_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """``m*c + A@B`` and ``p - c*n`` where the outputs are program outputs next to live inputs."""
    b = GraphBuilder("u")
    a = b.input("a", "f32", (5, 7))
    bb = b.input("b", "f32", (7, 4))
    m = b.input("m", "f32", (5, 4))
    p = b.input("p", "f32", (5, 4))
    mu = b.const(0.9, "f32")
    lr = b.const(0.1, "f32")
    m2 = m * mu + b.op("matmul", a, bb)
    p2 = p - lr * m2
    b.output(m2, "m2")
    b.output(p2, "p2")
    b.output(m + p, "keep")  # m and p stay live: nothing may be updated in place
    g = b.build()
    rng = np.random.default_rng(3)
    feed = {k: rng.random(s, dtype=np.float32) for k, s in
            (("a", (5, 7)), ("b", (7, 4)), ("m", (5, 4)), ("p", (5, 4)))}
    fused, exe = _run(g, feed, True, monkeypatch)
    m2r = np.float32(0.9) * feed["m"] + feed["a"] @ feed["b"]
    np.testing.assert_allclose(fused["m2"], m2r, rtol=1e-5)
    np.testing.assert_allclose(fused["p2"], feed["p"] - np.float32(0.1) * m2r, rtol=1e-5)
    np.testing.assert_allclose(fused["keep"], feed["m"] + feed["p"], rtol=1e-6)


def test_one_hot_cross_entropy_with_out_of_range_label(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.losses import softmax_cross_entropy

    b = GraphBuilder("ce")
    z = b.input("z", "f32", (6, 4))
    y = b.input("y", "i64", (6,))
    b.output(softmax_cross_entropy(b, b.op("log_softmax", z, axis=-1) * b.const(1.0, "f32"), y), "loss")
    g = b.build()
    rng = np.random.default_rng(4)
    feed = {"z": rng.standard_normal((6, 4)).astype(np.float32), "y": np.array([0, 3, 1, 7, 2, -1])}
    fused, _ = _run(g, feed, True, monkeypatch)
    plain, _ = _run(g, feed, False, monkeypatch)
    np.testing.assert_allclose(fused["loss"], plain["loss"], rtol=1e-5)


def test_profile_counts_every_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused call counts for each claim whose work it does: every LIR kernel is accounted for."""
    arch = (12, 6, 3)
    rt = ResidentTrainer(mlp_graph(arch, init_params(arch), 4), "loss", SGD(lr=0.1, momentum=0.9),
                         param_names(2), fusion=False)
    prog = rt.binding
    assert len(prog.runs) < len(rt.program.kernels)
    rng = np.random.default_rng(0)
    feed = {"x": rng.random((4, 12), dtype=np.float32), "y": rng.integers(0, 3, 4),
            "step": np.asarray(0, np.int64), **rt.values(),
            **rt.optimizer.init_state(rt.values())}
    _, counts = prog.profile(feed)
    want: dict[str, int] = {}
    for s in rt.program.kernels:
        want[s.kernel] = want.get(s.kernel, 0) + 1
    assert dict(counts) == want


def test_matmul_of_two_transposes_reads_both_sources() -> None:
    # Both operands of one matmul come from transposes the bind-time pass folds into the GEMM:
    # the second fold must keep the first (it once re-read the dropped transpose's buffer).
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from rlx_core.frontends.onnx import load_onnx

    rng = np.random.default_rng(3)
    a, b, c = (rng.random(s, np.float32) for s in ((4, 3), (5, 4), (1, 5)))
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.25, beta=0.35, transA=1, transB=1)
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
          for n, v in (("a", a), ("b", b), ("c", c))]
    g = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out = Session("cpu", use_cache=False).compile(load_onnx(model)).run({"a": a, "b": b, "c": c})
    np.testing.assert_allclose(out["y"], 0.25 * a.T @ b.T + 0.35 * c, rtol=1e-5, atol=1e-6)
    assert onnx is not None
