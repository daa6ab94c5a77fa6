"""INT8 post-training quantization and INT4 weight-only in the core (rlx_core.quant), on rlx-cpu.

The INT8 reference is rlx-cpu running the quantized ops through their MIR decompositions; it must
equal the ops' exact NumPy references bit for bit, and the quantized digits models must keep the
float models' accuracy.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rlx_conformance import run_suite

from rlx_core import GraphBuilder, Session
from rlx_core.dtypes import DType
from rlx_core.errors import IRError
from rlx_core.ir.reference import evaluate
from rlx_core.ir.serialize import load, save
from rlx_core.quant import (
    QUANT_OPS,
    QuantizationError,
    activation_qparams,
    calibrate,
    multiply_by_quantized_multiplier,
    quantize_graph,
    quantize_int4_groups,
    quantize_multiplier,
    quantize_weights_int4,
    quantize_weights_int8,
)
from rlx_core.quant import fixedpoint as fx
from rlx_core.quant.cli import quantize_command
from rlx_core.quant.examples import random_cnn, split_digits, train_cnn, train_mlp
from rlx_core.quant.ops import unpack_int4

OPS_KEYWORD = " or ".join(f"op::{op}[" for op in QUANT_OPS)


# -- the integer rules, against a literal transcription of the C code on Python ints -------------

def _c_srdhm(a: int, b: int) -> int:
    if a == b == -(2**31):
        return 2**31 - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    q = abs(ab + nudge) // (1 << 31)
    return q if ab + nudge >= 0 else -q  # C division truncates toward zero


def _c_rdbpot(x: int, e: int) -> int:
    mask = (1 << e) - 1
    rem = x & mask
    thr = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > thr else 0)


def _c_mbqm(x: int, m: int, s: int) -> int:
    left, right = max(s, 0), max(-s, 0)
    shifted = ((x << left) + 2**31) % 2**32 - 2**31  # (int32_t)((uint32_t)x << left)
    return _c_rdbpot(_c_srdhm(shifted, m), right)


def test_fixed_point_matches_the_c_rules() -> None:
    rnd = random.Random(7)
    ends = [-(2**31), -(2**31) + 1, -(2**30), -1, 0, 1, 2**30, 2**31 - 2, 2**31 - 1]
    xs = ends + [rnd.randint(-(2**31), 2**31 - 1) for _ in range(300)]
    ms = ends + [rnd.randint(-(2**31), 2**31 - 1) for _ in range(300)]
    ss = [rnd.randint(-31, 31) for _ in range(len(xs))]
    pairs = [(x, m, s) for x, m, s in zip(xs, ms, ss)] + [(x, m, s) for x in ends for m in ends
                                                          for s in (-31, -1, 0, 1, 31)]
    x, m, s = (np.array(v, np.int64) for v in zip(*pairs))
    assert fx.saturating_rounding_doubling_high_mul(x, m).tolist() == [_c_srdhm(a, b) for a, b, _ in pairs]
    e = np.abs(s)
    assert fx.rounding_divide_by_pot(x, e).tolist() == [_c_rdbpot(a, int(b)) for a, b in zip(x.tolist(), e)]
    assert multiply_by_quantized_multiplier(x, m, s).tolist() == [_c_mbqm(a, b, c) for a, b, c in pairs]
    with pytest.raises(IRError, match="shift"):
        multiply_by_quantized_multiplier(np.array([1]), np.array([1 << 30]), np.array([32]))


@pytest.mark.parametrize("real", [1e-9, 3.1e-5, 0.0027, 0.25, 0.5, 0.7071, 1.0, 1.9999999, 3.5, 1234.5])
def test_quantize_multiplier(real: float) -> None:
    m, s = quantize_multiplier(real)
    assert 2**30 <= m < 2**31
    assert abs(m * 2.0 ** (s - 31) - real) <= real * 2.0**-30
    # Applying it to an int equals round(x * real) up to the double rounding (at most 1 off).
    for x in (-100000, -3, 0, 7, 123456):
        assert abs(int(multiply_by_quantized_multiplier(x, m, s)) - x * real) <= 1.0
    assert quantize_multiplier(0.0) == (0, 0)


# -- the ops: every generated case, exact, through the decompositions (common_ir) on rlx-cpu --------

def test_quant_ops_are_certified_on_cpu_through_decompositions() -> None:
    cert = run_suite("cpu", keyword=OPS_KEYWORD)
    c = cert.counts()
    bad = [(r.id, r.status, r.message[:200]) for r in cert.results if r.status != "passed"]
    assert not bad, bad
    assert c["passed"] >= 100 and c["skipped"] == 0
    paths = {r.path for r in cert.results if r.path}  # ("-twice" checks record no path)
    assert paths == {"common_ir"}, paths  # rlx-cpu has no quantized kernels: MIR decompositions
    variants = cert.variants()
    for op in QUANT_OPS:
        (dt,) = [v for v in variants if v.startswith(f"{op}[")]
        assert variants[dt]["verdict"] == "certified", (op, variants[dt])


def test_op_validation_names_the_problem() -> None:
    g = GraphBuilder("bad")
    x = g.input("x", "i8", (2, 4))
    w = g.input("w", "i8", (3, 5))
    b = g.input("b", "i32", (3,))
    with pytest.raises(IRError, match="x has 4 features but w"):
        g.op("matmul_i8", x, w, b)
    f = g.input("f", "f32", (2, 4))
    with pytest.raises(IRError, match="expected i8"):
        g.op("dequantize", f, scale=0.1)
    with pytest.raises(IRError, match="positive float32"):
        g.op("quantize", f, scale=0.0)
    with pytest.raises(IRError, match="int8 range"):
        g.op("quantize", f, scale=0.5, zero_point=200)
    acc = g.input("acc", "i32", (2, 4))
    m = g.input("m", "i32", (3,))
    with pytest.raises(IRError, match="broadcast"):
        g.op("requantize", acc, m, m)
    x4 = g.input("x4", "i8", (1, 4, 4, 3))
    w4 = g.input("w4", "i8", (2, 3, 3, 2))
    with pytest.raises(IRError, match="groups"):
        g.op("conv2d_i8", x4, w4, g.input("b2", "i32", (2,)))


def test_softmax_i8_is_a_probability_distribution() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (64, 10)).astype(np.int64)
    y = fx.softmax_i8_reference(x, 0.1, 1.0, 1)
    p = (y + 128) / 256.0
    want = np.exp(0.1 * (x - x.max(1, keepdims=True)))
    want /= want.sum(1, keepdims=True)
    assert np.abs(p - want).max() <= 1.5 / 256 + 1e-3  # the int8 grid, plus the Q16 table
    assert (np.abs(p.sum(1) - 1.0) <= 10 / 256).all()


# -- schemes -------------------------------------------------------------------------------------

def test_activation_qparams_represent_zero_and_cover_the_range() -> None:
    for lo, hi in [(0.0, 1.0), (-1.0, 3.0), (-2.5, 0.0), (-0.3, 0.3), (0.0, 0.0), (1.0, 2.0)]:
        s, zp = activation_qparams(lo, hi)
        assert -128 <= zp <= 127
        assert s * (-128 - zp) <= min(lo, 0.0) + s and s * (127 - zp) >= max(hi, 0.0) - s
    assert activation_qparams(0.0, 2.55) == (pytest.approx(0.01), -128)
    s, zp = activation_qparams(-1.0, 3.0, symmetric=True)
    assert zp == 0 and s == pytest.approx(3.0 / 127)


def test_weight_schemes() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 20)) * np.array([0.01, 0.1, 1, 10, 100, 0])[:, None]
    q, s = quantize_weights_int8(w, axis=0)
    assert q.dtype == np.int8 and s.shape == (6,) and np.abs(q).max() <= 127
    err = np.abs(q * s[:, None].astype(np.float64) - w).max(axis=1)
    assert (err <= s / 2 + 1e-12).all()  # per channel: half a step of that channel
    qt, st = quantize_weights_int8(w, axis=None)
    assert st.shape == () and np.abs(qt[0]).max() == 0  # per tensor: the small channel vanishes
    packed, scales = quantize_int4_groups(w[:5], 4)
    assert packed.shape == (5, 10) and packed.dtype == np.uint8 and scales.shape == (5, 5)
    deq = unpack_int4(packed) * np.repeat(scales.astype(np.float64), 4, axis=1)
    assert np.abs(deq - w[:5]).max() <= np.repeat(scales, 4, axis=1).max() / 2 + 1e-9
    with pytest.raises(QuantizationError, match="group_size"):
        quantize_int4_groups(w, 7)


def test_calibration_methods() -> None:
    g = GraphBuilder("calib")
    x = g.input("x", "f32", ("batch", 4))
    g.output(g.relu(x * g.const(2.0, "f32")), "y")
    graph = g.build()
    data = np.linspace(-1, 1, 4000, dtype=np.float32).reshape(1000, 4)
    data[-1, -1] = 50.0  # one outlier (in place of the maximum, 1.0)
    mx = calibrate(graph, {"x": data}, method="maxabs", batch_size=128)
    pc = calibrate(graph, {"x": data}, method="percentile", percentile=99.0)
    mm = calibrate(graph, {"x": data}, method="minmax")
    assert (mx["x"].lo, mx["x"].hi) == (-50.0, 50.0)
    assert (mm["x"].lo, mm["x"].hi) == (-1.0, 50.0)
    assert pc["x"].hi < 1.0 and pc["x"].lo > -1.0  # the outlier is clipped
    assert mx["y"].lo == 0.0 and mx["y"].hi == 100.0  # non-negative after ReLU: [0, max]
    with pytest.raises(QuantizationError, match="method"):
        calibrate(graph, {"x": data}, method="kl")


# -- whole models ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return split_digits(d.images, d.target)


@pytest.fixture(scope="module")
def models(digits: dict[str, np.ndarray]) -> dict[str, object]:
    return {"mlp": train_mlp(digits["x_train"], digits["y_train"]),
            "cnn": train_cnn(digits["x_train"].reshape(-1, 1, 8, 8), digits["y_train"])}


def _x(name: str, x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, 1, 8, 8) if name == "cnn" else x


@pytest.mark.parametrize("name,method", [("mlp", "maxabs"), ("mlp", "percentile"), ("mlp", "minmax"),
                                         ("cnn", "maxabs"), ("cnn", "percentile")])
def test_digits_int8_keeps_accuracy_and_equals_the_reference(digits: dict[str, np.ndarray],
                                                             models: dict[str, object], name: str,
                                                             method: str) -> None:
    graph = models[name]
    x, y = _x(name, digits["x_test"]), digits["y_test"]
    cpu = Session("cpu", use_cache=False)
    acc_f = float((cpu.compile(graph).run(x=x)["probs"].argmax(1) == y).mean())
    q = quantize_graph(graph, {"x": _x(name, digits["x_train"][:400])}, method=method)
    ops = q.op_counts()
    assert {"quantize", "matmul_i8", "requantize", "softmax_i8", "dequantize"} <= set(ops)
    assert not {"matmul", "linear", "conv2d", "conv2d_bias", "softmax", "relu"} & set(ops)
    if name == "cnn":
        assert {"conv2d_i8", "max_pool2d_i8", "avg_pool2d_i8"} <= set(ops)
    exe = cpu.compile(q)
    probs = exe.run(x=x)["probs"]
    assert {e.path for e in exe.report.entries} <= {"common_ir", "native"}
    ref = evaluate(q, {"x": x})["probs"]
    assert probs.dtype == np.float32 and np.array_equal(probs.astype(np.float64), ref)
    acc_q = float((probs.argmax(1) == y).mean())
    print(f"\n{name} ({method}): float {100 * acc_f:.2f}%  int8 {100 * acc_q:.2f}% "
          f"on {len(y)} held-out digits")
    assert acc_f > 0.93
    assert abs(acc_q - acc_f) <= 0.01


def test_layouts_depthwise_padding_and_two_outputs() -> None:
    """NCHW input with 3 channels (int8 transpose), depthwise + strided convolutions, a lone ReLU, padded
    average pooling and a flatten that feeds an output (transposed back to NCHW order) and a dense."""
    graph = random_cnn()
    x = np.random.default_rng(1).uniform(-1, 1, (64, 3, 9, 9)).astype(np.float32)
    q = quantize_graph(graph, {"x": x[:48]})
    ops = q.op_counts()
    assert ops["transpose"] == 2 and ops["conv2d_i8"] == 2 and ops["maximum"] == 1 and ops["dequantize"] == 2
    cpu = Session("cpu", use_cache=False)
    f, got = cpu.compile(graph).run(x=x[48:]), cpu.compile(q).run(x=x[48:])
    ref = evaluate(q, {"x": x[48:]})
    for k in ("features", "probs"):
        assert np.array_equal(got[k].astype(np.float64), ref[k]), k
    assert np.abs(got["features"] - f["features"]).max() < 0.05 * np.abs(f["features"]).max()
    assert (got["probs"].argmax(1) == f["probs"].argmax(1)).mean() >= 0.9


def test_per_tensor_weights_and_symmetric_activations(digits: dict[str, np.ndarray],
                                                      models: dict[str, object]) -> None:
    graph = models["mlp"]
    q = quantize_graph(graph, {"x": digits["x_train"][:300]}, per_channel=False, symmetric_activations=True)
    reqs = [n for n in q.nodes if n.op == "requantize"]
    assert all(q.types[n.inputs[1]].shape == () for n in reqs)  # one multiplier per tensor
    assert all(int(n.attrs["zero_point"]) == 0 for n in reqs)
    x, y = digits["x_test"], digits["y_test"]
    got = Session("cpu", use_cache=False).compile(q).run(x=x)["probs"]
    assert np.array_equal(got.astype(np.float64), evaluate(q, {"x": x})["probs"])
    assert (got.argmax(1) == y).mean() > 0.95


def test_softmax_argmax_mode_and_int8_outputs(digits: dict[str, np.ndarray],
                                              models: dict[str, object]) -> None:
    graph = models["mlp"]
    calib = {"x": digits["x_train"][:300]}
    x = digits["x_test"][:60]
    cls = quantize_graph(graph, calib, softmax="argmax")
    assert cls.types["probs"].dtype is DType.I64
    raw = quantize_graph(graph, calib, dequantize_outputs=False)
    assert raw.types["probs"].dtype is DType.I8
    cpu = Session("cpu", use_cache=False)
    q8 = cpu.compile(raw).run(x=x)["probs"]
    full = cpu.compile(quantize_graph(graph, calib)).run(x=x)["probs"]
    assert np.array_equal((q8.astype(np.float32) + 128) / 256, full)
    labels = cpu.compile(cls).run(x=x)["probs"]
    assert labels.shape == (60,) and (labels == digits["y_test"][:60]).mean() > 0.9


def test_unsupported_op_is_reported_with_the_node() -> None:
    g = GraphBuilder("odd")
    x = g.input("x", "f32", ("batch", 4))
    w = g.param("w", np.ones((4, 4), np.float32))
    g.output(g.op("tanh", x @ w), "y")
    graph = g.build()
    with pytest.raises(QuantizationError) as e:
        quantize_graph(graph, {"x": np.ones((3, 4), np.float32)})
    assert "tanh" in e.value.what and "supports" in (e.value.fix or "")


def test_int8_model_file_roundtrip(tmp_path: Path, digits: dict[str, np.ndarray],
                                   models: dict[str, object]) -> None:
    q = quantize_graph(models["cnn"], {"x": digits["x_train"][:200].reshape(-1, 1, 8, 8)})
    save(q, tmp_path / "cnn_int8.rlx")
    back = load(tmp_path / "cnn_int8.rlx")
    assert back.fingerprint == q.fingerprint


def test_int4_weight_only(digits: dict[str, np.ndarray], models: dict[str, object]) -> None:
    graph = models["mlp"]
    q4 = quantize_weights_int4(graph, group_size=16)
    assert q4.op_counts().get("dequantize_int4") == 2
    w_f = sum(np.asarray(graph.weights[p.name]).nbytes for p in graph.params)
    w_4 = sum(np.asarray(q4.weights[p.name]).nbytes for p in q4.params)
    assert w_4 < w_f / 4
    x, y = digits["x_test"], digits["y_test"]
    cpu = Session("cpu", use_cache=False)
    acc_f = float((cpu.compile(graph).run(x=x)["probs"].argmax(1) == y).mean())
    acc_4 = float((cpu.compile(q4).run(x=x)["probs"].argmax(1) == y).mean())
    print(f"\nmlp int4 weight-only (groups of 16): float {100 * acc_f:.2f}%  int4 {100 * acc_4:.2f}%")
    assert acc_4 >= acc_f - 0.02


def test_quantize_cli(tmp_path: Path, digits: dict[str, np.ndarray], models: dict[str, object]) -> None:
    save(models["mlp"], tmp_path / "mlp.rlx")
    np.savez(tmp_path / "calib.npz", x=digits["x_train"][:200])
    runner = CliRunner()
    out = tmp_path / "mlp_int8.rlx"
    r = runner.invoke(quantize_command, [str(tmp_path / "mlp.rlx"), "--calib", str(tmp_path / "calib.npz"),
                                         "-o", str(out), "--method", "percentile"])
    assert r.exit_code == 0, r.output
    assert "int8" in r.output and "matmul_i8 x2" in r.output
    q = load(out)
    probs = Session("cpu", use_cache=False).compile(q).run(x=digits["x_test"][:20])["probs"]
    assert (probs.argmax(1) == digits["y_test"][:20]).mean() > 0.85
    r = runner.invoke(quantize_command, [str(tmp_path / "mlp.rlx"), "-o", str(tmp_path / "x.rlx")])
    assert r.exit_code == 2 and "--calib" in r.output
    r = runner.invoke(quantize_command, [str(tmp_path / "mlp.rlx"), "--int4", "--group-size", "16", "-o",
                                         str(tmp_path / "mlp_int4.rlx"), "--json"])
    assert r.exit_code == 0, r.output
    assert '"dequantize_int4": 2' in r.output
