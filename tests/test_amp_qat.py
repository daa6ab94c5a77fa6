"""Mixed precision (autocast, loss scaling, AmpTrainer) and quantization-aware training
(the fake_quant op, its straight-through gradient, qat_model) on small MLPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rlx_conformance.cases import cases_for

from rlx_core import GraphBuilder, Session
from rlx_core.amp import AmpTrainer, LossScaler, amp_train_step_graph, autocast
from rlx_core.autodiff import grad
from rlx_core.dtypes import DType
from rlx_core.errors import IRError, ShapeError
from rlx_core.ir.reference import evaluate
from rlx_core.ir.schema import REGISTRY
from rlx_core.optim import SGD, Trainer
from rlx_core.qat import (
    FAKE_QUANT,
    absmax_scale,
    calibrate_activation_scales,
    fake_quant,
    qat_model,
    quantize_weights,
)
from rlx_core.train_bench import (
    ResidentTrainer,
    digits_split,
    init_params,
    mlp_graph,
    param_names,
    thread_limits,
)


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    with thread_limits(1):
        yield


def _blobs(n: int = 320, d: int = 16, k: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, np.argmax(x[:, :k] + 0.3 * x[:, k:2 * k], axis=1).astype(np.int64)


def _run(trainer: Any, x: np.ndarray, y: np.ndarray, b: int, steps: int) -> list[float]:
    k = len(x) // b
    return [trainer.step(x=x[(i % k) * b:(i % k + 1) * b], y=y[(i % k) * b:(i % k + 1) * b])
            for i in range(steps)]


# -- mixed precision ---------------------------------------------------------------------------------

def test_autocast_policy() -> None:
    model = mlp_graph((16, 32, 4), init_params((16, 32, 4)), 8)
    g = autocast(model, "bf16")
    t = g.types
    by_op: dict[str, list] = {}
    for n in g.nodes:
        by_op.setdefault(n.op, []).append(n)
    for n in by_op["linear"]:  # matrix products in bf16, params cast where used
        assert all(t[i].dtype is DType.BF16 for i in n.inputs)
    assert t[by_op["relu"][0].outputs[0]].dtype is DType.BF16  # relu stays in the compute dtype
    assert t[by_op["log_softmax"][0].inputs[0]].dtype is DType.F32  # loss math in f32
    assert all(t[p.name].dtype is DType.F32 for p in g.params if p.name.startswith(("w", "b")))
    assert g.types["loss"].dtype is DType.F32
    x, y = _blobs(8)
    want = evaluate(model, {"x": x, "y": y})["loss"]
    got = Session("cpu").compile(g).run(x=x, y=y)["loss"]
    assert abs(float(got) - float(want)) < 2e-2 * abs(float(want))
    with pytest.raises(IRError):
        autocast(model, "i8")


def test_amp_step_graph_layout() -> None:
    model = mlp_graph((16, 8, 4), init_params((16, 8, 4)), 8)
    g = amp_train_step_graph(model, "loss", None, SGD(lr=0.1, momentum=0.9), compute_dtype="f16")
    names = [v.name for v in g.inputs]
    assert names[:2] == ["x", "y"]
    for n in ("w0", "b0", "w1", "b1", "step", "loss_scale", "growth_tracker", "w0.momentum_buffer"):
        assert n in names
    assert g.types["loss_scale"].dtype is DType.F32 and g.types["growth_tracker"].dtype is DType.I64
    assert g.outputs[0] == "loss" and g.outputs[1:5] == ("w0.next", "b0.next", "w1.next", "b1.next")
    assert g.outputs[-3:] == ("loss_scale.next", "growth_tracker.next", "found_inf")
    assert g.types["loss"].dtype is DType.F32 and g.types["w0.next"].dtype is DType.F32
    assert any(g.types[n.outputs[0]].dtype is DType.F16 for n in g.nodes if n.op == "linear")


def test_amp_in_f32_equals_the_plain_trainer() -> None:
    """A power-of-two loss scale is exact: f32 'mixed precision' is the f32 run, bit for bit."""
    model = mlp_graph((16, 32, 4), init_params((16, 32, 4), seed=1), 32)
    x, y = _blobs()
    ref = _run(Trainer(model, "loss", SGD(lr=0.1, momentum=0.9)), x, y, 32, 12)
    amp = AmpTrainer(model, "loss", SGD(lr=0.1, momentum=0.9), compute_dtype="f32",
                     scaler=LossScaler(init_scale=1024.0))
    assert _run(amp, x, y, 32, 12) == ref
    assert amp.skipped == 0 and amp.steps == 12 and amp.loss_scale == 1024.0


@pytest.mark.parametrize("dtype,tol", [("bf16", 2e-2), ("f16", 3e-3)])
def test_amp_tracks_the_f32_loss(dtype: str, tol: float) -> None:
    model = mlp_graph((16, 32, 4), init_params((16, 32, 4), seed=1), 32)
    x, y = _blobs()
    ref = _run(Trainer(model, "loss", SGD(lr=0.1, momentum=0.9)), x, y, 32, 40)
    amp = AmpTrainer(model, "loss", SGD(lr=0.1, momentum=0.9), compute_dtype=dtype,
                     scaler=LossScaler(init_scale=2.0 ** 12) if dtype == "f16" else None)
    got = _run(amp, x, y, 32, 40)
    assert amp.skipped == 0
    assert np.max(np.abs(np.subtract(got, ref))) < tol, (got[-3:], ref[-3:])
    assert got[-1] < 0.3 * got[0]
    assert all(v.dtype == np.float32 for v in amp.values.values())  # f32 master weights
    assert amp.model().types["w0"].dtype is DType.F32


def test_f16_overflow_backs_off_and_skips() -> None:
    model = mlp_graph((16, 32, 4), init_params((16, 32, 4), seed=1), 32)
    x, y = _blobs()
    xb, yb = x[:32], y[:32]
    amp = AmpTrainer(model, "loss", SGD(lr=0.1, momentum=0.9), compute_dtype="f16",
                     scaler=LossScaler(init_scale=2.0 ** 40))
    w0 = amp.values["w0"].copy()
    first = amp.step(x=xb, y=yb)
    assert amp.skipped == 1 and amp.steps == 0 and amp.loss_scale == 2.0 ** 39  # backed off
    np.testing.assert_array_equal(amp.values["w0"], w0)  # the step changed nothing
    np.testing.assert_array_equal(amp.state["w0.momentum_buffer"], 0.0)
    assert amp.step(x=xb, y=yb) == first  # same weights, same batch: same loss
    while amp.steps == 0 and amp.skipped < 60:
        amp.step(x=xb, y=yb)
    assert amp.steps == 1 and amp.skipped >= 20  # f16 overflowed until the scale came down
    good = amp.scale_history[-1]
    assert good == 2.0 ** 40 / 2 ** amp.skipped and amp.loss_scale == good
    assert not np.array_equal(amp.values["w0"], w0)


def test_loss_scale_grows_after_the_growth_interval() -> None:
    model = mlp_graph((16, 32, 4), init_params((16, 32, 4), seed=1), 32)
    x, y = _blobs()
    amp = AmpTrainer(model, "loss", SGD(lr=0.1, momentum=0.9), compute_dtype="f16",
                     scaler=LossScaler(init_scale=16.0, growth_interval=3))
    _run(amp, x, y, 32, 7)
    assert amp.skipped == 0
    assert amp.scale_history == [16.0, 16.0, 16.0, 32.0, 32.0, 32.0, 64.0]
    assert amp.loss_scale == 64.0


def test_disabled_scaler_still_skips_nonfinite_steps() -> None:
    model = mlp_graph((16, 8, 4), init_params((16, 8, 4)), 8)
    amp = AmpTrainer(model, "loss", SGD(lr=0.1), compute_dtype="bf16")
    assert amp.loss_scale == 1.0
    x, y = _blobs(8)
    x[0, 0] = np.inf
    w0 = amp.values["w0"].copy()
    amp.step(x=x, y=y)
    assert amp.skipped == 1 and amp.steps == 0 and amp.loss_scale == 1.0
    np.testing.assert_array_equal(amp.values["w0"], w0)


# -- quantization-aware training ---------------------------------------------------------------------

def _fq(x: np.ndarray, s: np.ndarray | float, lo: int = -128, hi: int = 127) -> np.ndarray:
    return np.clip(np.rint(np.asarray(x, np.float64) / s), lo, hi) * s


def test_fake_quant_schema_and_forward() -> None:
    schema = REGISTRY.get(FAKE_QUANT)
    assert schema.level == "hir" and schema.decompose is not None
    rng = np.random.default_rng(0)
    ties = [2.5 * 0.25, -2.5 * 0.25, 3.5 * 0.25, 40.0, -40.0]  # exact halves: round half to even
    x = np.concatenate([rng.uniform(-40, 40, 60), ties]).astype(np.float32).reshape(5, 13)
    g = GraphBuilder("fq")
    xi = g.input("x", "f32", x.shape)
    g.output(fake_quant(g, xi, 0.25), "per_tensor")
    s = np.linspace(0.1, 0.5, 5, dtype=np.float32).reshape(5, 1)
    g.output(g.op(FAKE_QUANT, xi, g.input("s", "f32", (5, 1)), qmin=-127, qmax=127), "per_row")
    graph = g.build()
    got = Session("cpu").compile(graph).run(x=x, s=s)
    pt = got["per_tensor"]
    np.testing.assert_allclose(pt, _fq(x, 0.25), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["per_row"], _fq(x, s, -127, 127), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(pt.reshape(-1)[-5:], [0.5, -0.5, 1.0, 127 * 0.25, -128 * 0.25])
    np.testing.assert_array_equal(pt / 0.25, np.rint(pt / 0.25))  # on the int8 grid
    np.testing.assert_allclose(evaluate(graph, {"x": x, "s": s})["per_tensor"], pt, atol=1e-6)
    with pytest.raises(ShapeError):
        g2 = GraphBuilder("bad")
        g2.op(FAKE_QUANT, g2.input("x", "f32", (3,)), g2.input("s", "f32", (2, 3)))
    # Every float dtype gets conformance cases (so every backend is tested on it).
    for dt in ("f16", "bf16", "f32", "f64"):
        assert cases_for(schema, dt)


def test_fake_quant_conforms_on_cpu() -> None:
    from rlx_conformance import run_suite

    cert = run_suite("cpu", keyword="op::fake_quant")
    c = cert.counts()
    assert c["passed"] == 8 and c["failed"] == 0 and c["error"] == 0, cert.to_markdown()[:2000]


def test_fake_quant_gradient_is_the_straight_through_estimator() -> None:
    rng = np.random.default_rng(1)
    s = 0.0625  # a power of two: x / s is exact at the clip edges below
    x = rng.uniform(-11, 11, (4, 6))  # |x| / s up to 176: some clipped, most not
    x[0, :3] = [127 * s, -128 * s, 127.6 * s]  # at the clip edges: pass, pass, clipped
    r = rng.standard_normal((4, 6))
    g = GraphBuilder("ste")
    xi = g.input("x", "f64", x.shape)
    si = g.input("s", "f64", ())
    y = g.op("reduce_sum", fake_quant(g, xi, si) * g.const(r, "f64"), axes=None)
    g.output(y, "loss")
    dg = grad(g.build(), "loss", ["x", "s"])
    want = r * ((x / s >= -128) & (x / s <= 127))
    assert 0 < want.astype(bool).sum() < x.size
    ref = evaluate(dg, {"x": x, "s": np.float64(s)})
    np.testing.assert_array_equal(ref["grad_x"], want)
    assert float(ref["grad_s"]) == 0.0  # no gradient to the scale
    cpu = Session("cpu").compile(dg).run(x=x, s=np.float64(s))
    np.testing.assert_allclose(cpu["grad_x"], want, atol=1e-12)
    assert want[0, 0] == r[0, 0] and want[0, 1] == r[0, 1] and want[0, 2] == 0.0


def test_qat_model_inserts_fake_quant_on_linear_weights_and_activations() -> None:
    arch = (16, 32, 4)
    model = mlp_graph(arch, init_params(arch), 8)
    q = qat_model(model)
    assert q.op_counts()[FAKE_QUANT] == 4 and q.outputs == model.outputs
    assert qat_model(model, activations=None).op_counts()[FAKE_QUANT] == 2
    first = next(n.name for n in model.nodes if n.op == "linear")
    assert qat_model(model, layers=[first]).op_counts()[FAKE_QUANT] == 2
    with pytest.raises(IRError):
        qat_model(model, layers=["nope"])
    x, y = _blobs(8)
    scales = calibrate_activation_scales(model, [{"x": x, "y": y}])
    assert set(scales) == {n.name for n in model.nodes if n.op == "linear"}
    assert scales[first] == pytest.approx(np.abs(x).max() / 127)
    static = qat_model(model, activations=scales, per_channel=True)
    a = Session("cpu").compile(static).run(x=x, y=y)["loss"]
    b = evaluate(model, {"x": x, "y": y})["loss"]
    assert abs(float(a) - float(b)) < 0.05 * abs(float(b))  # int8 simulation is close to float


def test_qat_mlp_on_digits_reaches_95_percent() -> None:
    pytest.importorskip("sklearn")
    xtr, ytr, xte, yte = digits_split(0)
    arch, b = (64, 128, 10), 32
    model = qat_model(mlp_graph(arch, init_params(arch, 0), b))
    tr = ResidentTrainer(model, "loss", SGD(lr=0.02, momentum=0.9), param_names(2))
    rng = np.random.default_rng(0)
    for _ in range(30):
        perm = rng.permutation(len(xtr))
        for i in range(len(xtr) // b):
            idx = perm[i * b:(i + 1) * b]
            tr.step(x=xtr[idx], y=ytr[idx])
    v = tr.values()
    trained = [(v[f"w{k}"], v[f"b{k}"]) for k in range(2)]
    infer = qat_model(mlp_graph(arch, trained, loss=False))  # the fake-quantized (int8) forward
    logits = Session("cpu").compile(infer).run(x=xte)["logits"]
    acc = float(np.mean(np.argmax(logits, 1) == yte))
    assert acc >= 0.95, acc
    # The int8 weights a deployment stores reproduce the fake-quantized weights exactly.
    ints = quantize_weights(mlp_graph(arch, trained, loss=False))
    qi, sc = ints["w0"]
    assert qi.dtype == np.int8 and np.abs(qi).max() == 127
    g = GraphBuilder("w")
    w = g.input("w", "f32", trained[0][0].shape)
    g.output(fake_quant(g, w, absmax_scale(g, w)), "wq")
    wq = Session("cpu").compile(g.build()).run(w=trained[0][0])["wq"]
    np.testing.assert_allclose(qi.astype(np.float32) * sc, wq, rtol=1e-6, atol=1e-7)
