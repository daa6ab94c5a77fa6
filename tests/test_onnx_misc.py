"""ONNX operators decomposed into existing RLX IR ops (``rlx_core.frontends.onnx_misc``, issue 17).

Each case is a small ``onnx.helper`` model run on rlx-cpu and compared with a NumPy float64 reference,
ONNX Runtime or onnx's ReferenceEvaluator: Atan/Asin/Acos over a dense sweep (specials included) in
float32 and float64, Col2Im, CenterCropPad, integer Pow, BatchNormalization training mode, Scan and
Loop. What cannot be exact is refused naming the operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from _onnxtools import make_model, run_rlx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

F32, F64, I64, I32 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def model(nodes: Any, inputs: Sequence[tuple[str, int, Sequence[int]]], outputs: Sequence[str] = ("y",),
          inits: dict[str, np.ndarray] | None = None, opset: int = 18) -> Any:
    return make_model(nodes, inputs, outputs, inits, opset)


def ort_run(m: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in sess.run(None, feeds)]


def check(m: Any, feeds: dict[str, np.ndarray], ref: list[np.ndarray] | None = None,
          rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Equal to ``ref`` (default: onnx's ReferenceEvaluator) exactly for integers, else to rtol/atol."""
    if ref is None:
        ref = [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]
    got_all = run_rlx(m, feeds)
    assert len(got_all) == len(ref)
    for got, want in zip(got_all, ref):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def ulp_error(got: np.ndarray, want64: np.ndarray, dtype: Any) -> float:
    """The largest error in units of the last place of ``dtype`` at the true value (NaN must match)."""
    assert np.array_equal(np.isnan(got), np.isnan(want64))
    ok = ~np.isnan(want64)
    spacing = np.spacing(np.abs(want64[ok]).astype(dtype)).astype(np.float64)
    spacing = np.maximum(spacing, np.finfo(dtype).smallest_subnormal)
    return float(np.max(np.abs(got[ok].astype(np.float64) - want64[ok]) / spacing))


def _sweep() -> np.ndarray:
    dense = np.linspace(-1.0, 1.0, 40001)
    wide = np.concatenate([np.geomspace(1e-30, 1e30, 20001), -np.geomspace(1e-30, 1e30, 2001)])
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 0.66, 2.414213562373095,
                np.nextafter(1.0, 0.0), np.nextafter(-1.0, 0.0), 1.0000001, -1.0000001, 5e-324]
    return np.concatenate([dense, wide, specials])


@pytest.mark.parametrize("op,ref", [("Atan", np.arctan), ("Asin", np.arcsin), ("Acos", np.arccos)])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_inverse_trig_dense_sweep(op: str, ref: Any, dt: Any) -> None:
    with np.errstate(over="ignore"):  # 1e300 becomes inf in float32, which the sweep wants too
        x = _sweep().astype(dt)
    m = model(helper.make_node(op, ["x"], ["y"]), [("x", helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                                      x.shape)])
    with np.errstate(invalid="ignore"):
        want = ref(x.astype(np.float64))
    (got,) = run_rlx(m, {"x": x})
    assert got.dtype == dt
    err = ulp_error(got, want, dt)
    print(op, np.dtype(dt).name, f"max error {err:.2f} ulp")
    # A few ulp of the result's own type (float64: ~1e-15 relative, far inside 1e-12).
    assert err <= 4.0, err
    for special in (np.inf, -np.inf, 1.0, -1.0, 0.0):
        i = int(np.flatnonzero(x == special)[0])
        with np.errstate(invalid="ignore"):
            np.testing.assert_equal(got[i], ref(dt(special)))


def test_inverse_trig_float16_and_ort() -> None:
    x = np.linspace(-0.99, 0.99, 101).astype(np.float16)
    for op, ref in (("Atan", np.arctan), ("Asin", np.arcsin), ("Acos", np.arccos)):
        m = model(helper.make_node(op, ["x"], ["y"]), [("x", TensorProto.FLOAT16, x.shape)])
        (got,) = run_rlx(m, {"x": x})
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), ref(x.astype(np.float64)), rtol=1e-3, atol=1e-3)
    x32 = np.linspace(-3, 3, 61).astype(np.float32)
    m = model(helper.make_node("Atan", ["x"], ["y"]), [("x", F32, x32.shape)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    check(m, {"x": x32}, [sess.run(None, {"x": x32})[0]])


# -- Col2Im, CenterCropPad ------------------------------------------------------------------------

@pytest.mark.parametrize("image,block,kw", [
    ((5, 5), (2, 2), {}),
    ((6, 5), (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((3, 4, 5), (2, 2, 2), {"strides": [1, 2, 1]}),
])
def test_col2im_matches_reference(image: tuple[int, ...], block: tuple[int, ...], kw: dict) -> None:
    nd = len(image)
    s, p, d = kw.get("strides", [1] * nd), kw.get("pads", [0] * 2 * nd), kw.get("dilations", [1] * nd)
    blocks = [(image[i] + p[i] + p[i + nd] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    x = np.random.default_rng(0).standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks))))
    x = x.astype(np.float32)
    m = model(helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **kw), [("x", F32, x.shape)],
              inits={"image": np.array(image, np.int64), "block": np.array(block, np.int64)})
    check(m, {"x": x})


def test_col2im_run_time_image_shape_is_refused() -> None:
    m = model(helper.make_node("Col2Im", ["x", "image", "block"], ["y"]),
              [("x", F32, (1, 4, 16)), ("image", I64, (2,))], inits={"block": np.array([2, 2], np.int64)})
    with pytest.raises(UnsupportedOnnxError, match="Col2Im image_shape is computed at run time"):
        load_onnx(m)


@pytest.mark.parametrize("shape,target,axes", [((5, 7, 3), (3, 4, 3), None), ((4, 6, 3), (7, 3), [0, 1]),
                                               ((3, 5, 4), (6, 3), [-2, -1]), ((2, 3), (2, 3), None)])
def test_center_crop_pad(shape: tuple[int, ...], target: tuple[int, ...], axes: list[int] | None) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1
    kw = {} if axes is None else {"axes": axes}
    m = model(helper.make_node("CenterCropPad", ["x", "s"], ["y"], **kw), [("x", F32, shape)],
              inits={"s": np.array(target, np.int64)})
    check(m, {"x": x})
    xi = x.astype(np.int32)
    m = model(helper.make_node("CenterCropPad", ["x", "s"], ["y"], **kw), [("x", I32, shape)],
              inits={"s": np.array(target, np.int64)})
    check(m, {"x": xi})


# -- Pow with an integer base ---------------------------------------------------------------------

def _np_int_pow(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Exact x ** e modulo 2**w (NumPy's wrapping integer power), with the truncated value for e < 0."""
    x, e = np.broadcast_arrays(x, e)
    out = np.empty(x.shape, x.dtype)
    w = x.dtype.itemsize * 8
    for i in np.ndindex(x.shape):
        b, k = int(x[i]), int(e[i])
        if k >= 0:
            v = pow(b, k, 1 << w)
        else:
            v = 1 if b == 1 else ((-1) ** (-k) if b == -1 else 0)
        v &= (1 << w) - 1
        out[i] = v - (1 << w) if v >= 1 << (w - 1) else v
    return out


@pytest.mark.parametrize("dt,onnx_dt", [(np.int32, I32), (np.int64, I64), (np.int8, TensorProto.INT8)])
def test_integer_pow_is_exact_and_wraps(dt: Any, onnx_dt: int) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(-9, 10, 40), [2, 3, -3, 7, 0, 1, -1, 2, -2, 0]]).astype(dt)
    e = np.concatenate([rng.integers(0, 70, 40), [62, 40, 41, 100, 0, -5, -3, -2, -1, -1]]).astype(dt)
    m = model(helper.make_node("Pow", ["x", "e"], ["y"]), [("x", onnx_dt, x.shape), ("e", onnx_dt, e.shape)])
    (got,) = run_rlx(m, {"x": x, "e": e})
    np.testing.assert_array_equal(got, _np_int_pow(x, e))
    ok = e >= 0  # NumPy refuses negative integer powers; where it answers it agrees
    np.testing.assert_array_equal(got[ok], np.power(x[ok], e[ok]))


def test_integer_pow_constant_and_float_exponents() -> None:
    x = np.array([[3, -2, 5], [7, 0, -1]], np.int64)
    m = model(helper.make_node("Pow", ["x", "e"], ["y"]), [("x", I64, x.shape)], inits={"e": np.array(13)})
    (got,) = run_rlx(m, {"x": x})
    np.testing.assert_array_equal(got, np.power(x, 13))
    xf = np.array([3, 9, 2, 10, 5, 7], np.int32)
    ef = np.array([2.0, 0.5, 10.0, 1.5, 0.0, 3.0], np.float32)
    m = model(helper.make_node("Pow", ["x", "e"], ["y"]), [("x", I32, xf.shape), ("e", F32, ef.shape)])
    check(m, {"x": xf, "e": ef}, [np.power(xf, ef).astype(np.int32)])


# -- BatchNormalization training mode ------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3)])
def test_batchnorm_training_mode(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32) * 3 + 1
    c = shape[1]
    inits = {"s": rng.uniform(0.5, 1.5, c).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32), "v": rng.uniform(0.5, 2, c).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.8, epsilon=1e-3)
    m = model(node, [("x", F32, shape)], ("y", "rm", "rv"), inits, opset=15)
    check(m, {"x": x}, rtol=1e-4, atol=1e-5)
    # inference mode with statistics outputs is not defined: refused naming the node and the fix
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm"])
    with pytest.raises(UnsupportedOnnxError, match="training_mode=1"):
        load_onnx(model(node, [("x", F32, shape)], ("y", "rm"), inits, opset=15))


# -- Scan and Loop --------------------------------------------------------------------------------

def _scan_body() -> Any:
    """state += x_t; out_t = state * x_t (a running sum and a product per step)."""
    nodes = [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
             helper.make_node("Mul", ["s_out", "x_t"], ["o_t"])]
    return helper.make_graph(nodes, "body", [helper.make_tensor_value_info("s_in", F32, [3]),
                                             helper.make_tensor_value_info("x_t", F32, [3])],
                             [helper.make_tensor_value_info("s_out", F32, [3]),
                              helper.make_tensor_value_info("o_t", F32, [3])])


@pytest.mark.parametrize("kw", [{}, {"scan_input_directions": [1]}, {"scan_output_axes": [1]},
                                {"scan_input_axes": [1], "scan_output_directions": [1]}])
def test_scan_unrolled(kw: dict) -> None:
    xs_shape = (3, 4) if kw.get("scan_input_axes") == [1] else (4, 3)
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=_scan_body(), num_scan_inputs=1, **kw)
    m = model(node, [("s0", F32, (3,)), ("xs", F32, xs_shape)], ("s", "ys"))
    rng = np.random.default_rng(1)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32),
             "xs": rng.standard_normal(xs_shape).astype(np.float32)}
    check(m, feeds, ort_run(m, feeds))  # onnx's reference has no reversed directions or other axes


def _loop_body() -> Any:
    """acc = acc * 2 + i; scan output: acc."""
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32)))
    nodes = [two, helper.make_node("Cast", ["i"], ["fi"], to=F32),
             helper.make_node("Mul", ["a_in", "two"], ["t"]), helper.make_node("Add", ["t", "fi"], ["a_out"]),
             helper.make_node("Identity", ["c_in"], ["c_out"]),
             helper.make_node("Identity", ["a_out"], ["scan"])]
    return helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", I64, []),
                                             helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("a_in", F32, [2])],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("a_out", F32, [2]),
                              helper.make_tensor_value_info("scan", F32, [2])])


def test_loop_with_a_constant_trip_count() -> None:
    node = helper.make_node("Loop", ["M", "", "a0"], ["a", "scans"], body=_loop_body())
    m = model(node, [("a0", F32, (2,))], ("a", "scans"), inits={"M": np.array(5, np.int64)})
    feeds = {"a0": np.array([0.5, -1.0], np.float32)}
    check(m, feeds, ort_run(m, feeds))


def test_loop_with_a_run_time_trip_count_is_refused() -> None:
    node = helper.make_node("Loop", ["M", "", "a0"], ["a", "scans"], body=_loop_body())
    m = model(node, [("M", I64, ()), ("a0", F32, (2,))], ("a", "scans"))
    with pytest.raises(UnsupportedOnnxError, match="trip count M is computed at run time"):
        load_onnx(m)


# -- bitwise ops (the bitwise_* IR ops) ----------------------------------------------------------

_INT_TYPES = [(np.int8, TensorProto.INT8), (np.int16, TensorProto.INT16), (np.int32, I32), (np.int64, I64),
              (np.uint8, TensorProto.UINT8)]


@pytest.mark.parametrize("dt,onnx_dt", _INT_TYPES)
def test_bitwise_ops_match_numpy(dt: Any, onnx_dt: int) -> None:
    info = np.iinfo(dt)
    rng = np.random.default_rng(9)
    a = np.concatenate([rng.integers(info.min, info.max, 20, endpoint=True),
                        [info.min, info.max, 0, -1 if info.min < 0 else 1]]).astype(dt).reshape(2, 12)
    b = rng.integers(info.min, info.max, (1, 12), endpoint=True).astype(dt)
    for op, fn in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or),
                   ("BitwiseXor", np.bitwise_xor)):
        m = model(helper.make_node(op, ["a", "b"], ["y"]), [("a", onnx_dt, a.shape), ("b", onnx_dt, b.shape)])
        check(m, {"a": a, "b": b}, [fn(a, b)])
    m = model(helper.make_node("BitwiseNot", ["a"], ["y"]), [("a", onnx_dt, a.shape)])
    check(m, {"a": a}, [np.invert(a)])


def test_bitwise_ops_fail_to_compile_where_no_backend_claims_them() -> None:
    """A backend without bitwise kernels gets a DispatchError naming the op (no silent fallback)."""
    from rlx_core import GraphBuilder
    from rlx_core.errors import DispatchError
    from rlx_core.plugin import PLUGIN_API_VERSION, BackendInfo, DeviceCaps, DeviceInfo, KernelClaim, hookimpl

    class AddOnly:
        @hookimpl
        def rlx_backend_info(self) -> BackendInfo:
            return BackendInfo(name="addonly", version="1.0", api_version=PLUGIN_API_VERSION)

        @hookimpl
        def rlx_probe_devices(self) -> list[DeviceInfo]:
            caps = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-6)
            return [DeviceInfo(backend="addonly", name="addonly:0", available=True, caps=caps)]

        @hookimpl
        def rlx_kernels(self, device: DeviceInfo) -> list[KernelClaim]:
            return [KernelClaim("add", "addonly.add", dtypes={"i32"})]

        @hookimpl
        def rlx_compile(self, program: Any, device: DeviceInfo) -> Any:  # pragma: no cover - never reached
            raise AssertionError("bitwise_and must not compile here")

    hub = Hub(autoload=False)
    hub.register(AddOnly(), "addonly", distribution="rlx-addonly")
    b = GraphBuilder("bits")
    x, y = b.input("x", "i32", (4,)), b.input("y", "i32", (4,))
    b.output(b.op("bitwise_and", x, y))
    with pytest.raises(DispatchError, match="bitwise_and"):
        Session("addonly", hub=hub, use_cache=False).compile(b.build())


# -- TfIdfVectorizer ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,weighted", [("TF", False), ("IDF", True), ("IDF", False), ("TFIDF", True)])
@pytest.mark.parametrize("shape,onnx_dt,dt", [((2, 12), I64, np.int64), ((15,), I32, np.int32)])
def test_tfidf_vectorizer_matches_reference(mode: str, weighted: bool, shape: tuple[int, ...],
                                            onnx_dt: int, dt: Any) -> None:
    """Unigrams, bigrams and trigrams with skips up to 2 (unigrams counted once), a gram mapped to a
    shared output slot, IDF/TFIDF weights."""
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 4]  # 1-grams: 2 3 5 4; 2-grams: 56 78 67; 3-gram: 234
    attrs: dict[str, Any] = {"mode": mode, "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 2,
                             "ngram_counts": [0, 4, 10], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6, 4],
                             "pool_int64s": pool}
    if weighted:  # weights need n-gram i in slot i (see test_tfidf_ambiguous_weights_are_refused)
        attrs["weights"] = [0.5, 1.0, 2.0, 0.25, 3.0, 1.5, 0.75, 2.5]
        attrs["ngram_indexes"] = list(range(8))
    x = np.random.default_rng(2).integers(2, 9, shape).astype(dt)
    m = model(helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs), [("x", onnx_dt, shape)])
    check(m, {"x": x}, ort_run(m, {"x": x}))
    if weighted:  # onnx's reference fails on IDF without weights
        check(m, {"x": x})


def test_tfidf_ambiguous_weights_are_refused() -> None:
    attrs = {"mode": "TFIDF", "min_gram_length": 1, "max_gram_length": 1, "max_skip_count": 0,
             "ngram_counts": [0], "ngram_indexes": [1, 0], "pool_int64s": [4, 5], "weights": [2.0, 3.0]}
    m = model(helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs), [("x", I64, (6,))])
    with pytest.raises(UnsupportedOnnxError, match="ambiguous"):
        load_onnx(m)


# -- operators expanded into their ONNX function body --------------------------------------------

@pytest.mark.parametrize("name", ["test_swiglu_alpha", "test_linear_attention_gated_delta_gqa",
                                  "test_linear_attention_prefill_with_past",
                                  "test_causal_conv_with_state_basic"])
def test_function_defined_operators_pass_their_node_cases(name: str) -> None:
    """LinearAttention, CausalConvWithState and SwiGLU (opset 27-28) run as the spec's own function
    body; checked on onnx's node cases (their reference outputs, the suite's tolerance)."""
    from rlx_core.frontends import onnx_backend as ob

    (case,) = [c for c in ob.node_test_cases(name) if c.name == name]
    r = ob.run_case(case)
    assert r.status == ob.PASSED, (r.status, r.reason)


# -- CumProd, EyeLike, ReverseSequence ------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumprod(exclusive: int, reverse: int, axis: int) -> None:
    x = np.random.default_rng(6).uniform(0.5, 1.5, (3, 5)).astype(np.float32)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    m = model(node, [("x", F32, x.shape)], inits={"axis": np.array(axis, np.int64)}, opset=26)
    check(m, {"x": x})
    xi = np.random.default_rng(7).integers(-50, 50, (4, 6)).astype(np.int64)  # products wrap
    m = model(node, [("x", I64, xi.shape)], inits={"axis": np.array(axis, np.int64)}, opset=26)
    check(m, {"x": xi})


@pytest.mark.parametrize("k,dtype", [(0, None), (2, TensorProto.INT32), (-1, TensorProto.DOUBLE)])
def test_eyelike(k: int, dtype: int | None) -> None:
    kw: dict[str, Any] = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    m = model(helper.make_node("EyeLike", ["x"], ["y"], **kw), [("x", F32, (3, 5))])
    check(m, {"x": np.zeros((3, 5), np.float32)})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    shape = (5, 3, 2) if time_axis == 0 else (3, 5, 2)
    x = np.arange(30, dtype=np.float32).reshape(shape)
    lens = np.array([5, 0, 3], np.int64)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis,
                            time_axis=time_axis)
    m = model(node, [("x", F32, shape), ("lens", I64, (3,))])
    check(m, {"x": x, "lens": lens}, ort_run(m, {"x": x, "lens": lens}))
