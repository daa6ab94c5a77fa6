"""ONNX operators translated by ``rlx_core.frontends.onnx_ops2`` (issue 17): float Mod and BitCast
on the exact IR ops ``mod``/``bitcast`` (``rlx_core.ir.ops.exact``), LpPool, MaxUnpool, Det.

Each case is a small ``onnx.helper`` model run on rlx-cpu and compared with NumPy (float64 or the
exact NumPy operation), ONNX Runtime or onnx's ReferenceEvaluator. Ambiguous or impossible cases
must be refused naming the operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from _onnxtools import run_rlx as run_outputs  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx, load_onnx_model  # noqa: E402
from rlx_core.ir.builder import GraphBuilder  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

F16, F32, F64, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def model(nodes: Any, inputs: Sequence[tuple[str, int, Sequence[int]]], out_type: int,
          inits: dict[str, np.ndarray] | None = None, opset: int = 22) -> Any:
    nodes = nodes if isinstance(nodes, list) else [nodes]
    graph = helper.make_graph(nodes, "case",
                              [helper.make_tensor_value_info(n, dt, list(s)) for n, dt, s in inputs],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              initializer=[numpy_helper.from_array(np.asarray(a), n)
                                           for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def ref_run(m: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]


def run_rlx(m: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return run_outputs(m, feeds)[0]


def ort_run(m: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, feeds)[0])


def bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit (NaN payloads and the sign of zero included)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u))


# -- Mod on floats -----------------------------------------------------------------------------

def _mod_operands(dt: Any, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    hi = 14 if dt == np.float16 else 60
    a = np.ldexp(rng.uniform(1, 2, n), rng.integers(-10, hi, n)) * rng.choice([-1, 1], n)
    b = np.ldexp(rng.uniform(1, 2, n), rng.integers(-6, 8, n)) * rng.choice([-1, 1], n)
    a[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 5, -5, 5, -5, 3.0, 1e-3, -7]
    b[:12] = [3.0, -3.0, 2.0, 2.0, 2.0, np.inf, np.inf, -np.inf, -np.inf, 0.0, -0.0, np.nan]
    return a.astype(dt), b.astype(dt)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dt,code", [(np.float32, F32), (np.float64, F64), (np.float16, F16)])
def test_float_mod_is_exact(fmod: int, dt: Any, code: int) -> None:
    a, b = _mod_operands(dt)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    m = model(node, [("a", code, a.shape), ("b", code, b.shape)], code, opset=13 if fmod else 28)
    got = run_rlx(m, {"a": a, "b": b})
    with np.errstate(all="ignore"):
        want = np.fmod(a, b) if fmod else np.mod(a, b)
    bits_equal(got, want)
    if fmod:  # ONNX Runtime's std::fmod agrees bit for bit
        bits_equal(got, ort_run(m, {"a": a, "b": b}))
    # a - trunc(a/b)*b would be wrong here: quotients above 2**24 leave whole units of error
    big = np.abs(a.astype(np.float64)) > 2.0 ** 30
    assert big.any()


def test_float_mod_broadcasts_with_a_constant_divisor() -> None:
    a = np.linspace(-10, 10, 24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([[1.5], [-2.25], [7.0]], np.float32)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    m = model(node, [("a", F32, a.shape)], F32, {"b": b}, opset=28)
    bits_equal(run_rlx(m, {"a": a}), np.mod(a, b))


# -- BitCast -----------------------------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.float64, np.int64),
                                     (np.int64, np.float64), (np.float16, np.int16), (np.uint16, np.float16),
                                     (np.int8, np.uint8), (np.uint32, np.int32), (np.bool_, np.uint8)])
def test_bitcast_reinterprets_bits(src: Any, dst: Any) -> None:
    rng = np.random.default_rng(1)
    if np.dtype(src).kind == "f":
        x = (rng.standard_normal((3, 7)) * 1e3).astype(src)
        x.flat[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    elif src is np.bool_:
        x = rng.random((3, 7)) < 0.5
    else:
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max, (3, 7), endpoint=True, dtype=src)
        x.flat[:2] = [info.min, info.max]
    src_code = helper.np_dtype_to_tensor_dtype(np.dtype(src))
    dst_code = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    m = model(helper.make_node("BitCast", ["x"], ["y"], to=dst_code), [("x", src_code, x.shape)], dst_code,
              opset=26)
    bits_equal(run_rlx(m, {"x": x}), x.view(dst))


def test_bitcast_on_a_transposed_input() -> None:
    """A non-contiguous operand (here a transpose feeding it) is reinterpreted element by element."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    m = model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
               helper.make_node("BitCast", ["t"], ["y"], to=TensorProto.INT32)], [("x", F32, x.shape)],
              TensorProto.INT32, opset=26)
    bits_equal(run_rlx(m, {"x": x}), np.ascontiguousarray(x.T).view(np.int32))


@pytest.mark.parametrize("src,to,msg", [(F32, TensorProto.INT64, "width"),
                                        (TensorProto.UINT8, TensorProto.BOOL, "bool")])
def test_bitcast_refusals(src: int, to: int, msg: str) -> None:
    m = model(helper.make_node("BitCast", ["x"], ["y"], to=to), [("x", src, (2,))], to, opset=26)
    with pytest.raises(UnsupportedOnnxError, match=msg) as e:
        load_onnx(m)
    assert "BitCast" in str(e.value)


def test_ir_ops_reference_matches_kernel() -> None:
    """The float64 references of ``mod``/``bitcast`` give the storage-precision kernels' results."""
    from rlx_core.ir.reference import evaluate

    b = GraphBuilder("exact")
    x = b.input("x", "f32", (4, 5))
    y = b.input("y", "f32", (4, 5))
    b.output(b.op("mod", x, y, mode="floor"), "m")
    b.output(b.op("bitcast", x, to="i32", src="f32"), "c")
    g = b.build()
    a, d = _mod_operands(np.float32, 20)
    feeds = {"x": a.reshape(4, 5), "y": d.reshape(4, 5)}
    ref = evaluate(g, feeds)
    out = Session("cpu", use_cache=False).compile(g).run(feeds)
    bits_equal(np.asarray(out["m"]), ref["m"].astype(np.float32))
    np.testing.assert_array_equal(np.asarray(out["c"]), a.reshape(4, 5).view(np.int32))
    np.testing.assert_array_equal(ref["c"], a.reshape(4, 5).view(np.int32))


# -- LpPool ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 9), dict(kernel_shape=[3], p=3)),
    ((2, 3, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=1)),
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2], dilations=[2, 2], p=2)),
    ((1, 2, 8, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, p=2)),
    ((1, 1, 6, 5), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER", p=4)),
    ((1, 2, 4, 5, 3), dict(kernel_shape=[2, 2, 2], p=2)),
])
def test_lp_pool_matches_onnx_reference(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    m = model(helper.make_node("LpPool", ["x"], ["y"], **attrs), [("x", F32, shape)], F32)
    got = run_rlx(m, {"x": x})
    if "ceil_mode" in attrs:
        # onnx's reference computes LpPool as an average times the kernel size, so a window that
        # ceil_mode extends past the input is scaled up (9/6 here); the operator is the p-norm of
        # the window's elements (padding is zero), which ONNX Runtime computes and RLX follows
        want = ort_run(m, {"x": x})
        assert not np.allclose(ref_run(m, {"x": x})[0], want)
    else:
        want = ref_run(m, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    if "dilations" not in attrs:
        np.testing.assert_allclose(got, ort_run(m, {"x": x}), rtol=2e-5, atol=1e-5)


# -- MaxUnpool ---------------------------------------------------------------------------------

def test_max_unpool_after_overlapping_max_pool() -> None:
    """Overlapping windows select one element twice: it is written once, not summed."""
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 5)).astype(np.float32)
    x[0, 0, 2, 2] = 10.0  # the maximum of four overlapping windows
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[3, 3], strides=[2, 2])
    pm = model(pool, [("x", F32, x.shape)], F32)
    pm.graph.ClearField("output")
    pm.graph.output.extend([helper.make_tensor_value_info("p", F32, None),
                            helper.make_tensor_value_info("i", I64, None)])
    p, i = ref_run(pm, {"x": x})
    unpool = helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    m = model(unpool, [("p", F32, p.shape), ("i", I64, i.shape)], F32)
    got = run_rlx(m, {"p": p, "i": i})
    want = ref_run(m, {"p": p, "i": i})[0]
    np.testing.assert_array_equal(got, want)
    assert got[0, 0, 2, 2] == 10.0
    np.testing.assert_array_equal(got, ort_run(m, {"p": p, "i": i}))


def test_max_unpool_other_output_shape_is_refused() -> None:
    unpool = helper.make_node("MaxUnpool", ["p", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    m = model(unpool, [("p", F32, (1, 1, 2, 2)), ("i", I64, (1, 1, 2, 2))], F32,
              {"s": np.array([1, 1, 5, 5], np.int64)})
    with pytest.raises(UnsupportedOnnxError, match="ambiguous"):
        load_onnx(m)


# -- Det ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dt,code", [((4, 4), np.float64, F64), ((3, 2, 5, 5), np.float32, F32),
                                           ((6, 1, 1), np.float32, F32), ((7, 3, 3), np.float64, F64)])
def test_det_matches_numpy(shape: tuple[int, ...], dt: Any, code: int) -> None:
    a = np.random.default_rng(4).standard_normal(shape).astype(dt)
    if len(shape) == 3 and shape[-1] == 3:  # permutation matrices: every pivot parity, exact +-1
        for k, perm in enumerate([(0, 1, 2), (1, 0, 2), (1, 2, 0), (2, 1, 0), (2, 0, 1), (0, 2, 1)]):
            a[k] = np.eye(3)[list(perm)]
        a[6] = [[1, 2, 3], [2, 4, 6], [0, 1, 1]]  # singular: 0
    m = model(helper.make_node("Det", ["a"], ["y"]), [("a", code, shape)], code)
    got = run_rlx(m, {"a": a})
    want = np.linalg.det(a.astype(np.float64))
    assert got.shape == want.shape and got.dtype == dt
    np.testing.assert_allclose(got, want, rtol=1e-5 if dt == np.float32 else 1e-12, atol=1e-6)


# -- AffineGrid, RoiAlign, DeformConv ---------------------------------------------------------

@pytest.mark.parametrize("size,align", [((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((1, 1, 3, 1, 4), 1),
                                        ((2, 1, 2, 3, 2), 0)])
def test_affine_grid_matches_onnx_reference(size: tuple[int, ...], align: int) -> None:
    r = len(size) - 2
    theta = np.random.default_rng(6).standard_normal((size[0], r, r + 1)).astype(np.float32)
    m = model(helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=align),
              [("theta", F32, theta.shape)], F32, {"size": np.array(size, np.int64)}, opset=20)
    got = run_rlx(m, {"theta": theta})
    want = ref_run(m, {"theta": theta})[0]
    assert got.shape == want.shape == (size[0], *size[2:], r)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [dict(),
                                   dict(mode="max", output_height=3, output_width=2, sampling_ratio=2),
                                   dict(coordinate_transformation_mode="output_half_pixel", spatial_scale=0.5,
                                        output_height=2, output_width=4)])
def test_roi_align_matches_onnx_runtime(attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 8, 9)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 6.5, 7.0], [2.0, 0.0, 3.0, 1.5], [-2.0, -1.0, 10.0, 12.0], [4, 4, 4, 4]],
                    np.float32)
    bidx = np.array([0, 1, 1, 0], np.int64)
    m = model(helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs),
              [("x", F32, x.shape), ("rois", F32, rois.shape), ("b", I64, bidx.shape)], F32,
              opset=16)  # ONNX Runtime has RoiAlign up to 16 (22 only adds bfloat16)
    feeds: dict[str, np.ndarray] = {"x": x, "rois": rois, "b": bidx}
    want = ort_run(m, feeds)
    np.testing.assert_allclose(ref_run(m, feeds)[0], want, rtol=1e-5, atol=1e-5)  # the two agree
    # the rois are run-time inputs: staged execution supplies their values to the importer
    staged = load_onnx_model(m, device="cpu")
    assert staged.staged
    got = np.asarray(staged.run(feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # with constant rois it is one plain graph
    mc = model(helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs), [("x", F32, x.shape)], F32,
               {"rois": rois, "b": bidx}, opset=16)
    np.testing.assert_allclose(run_rlx(mc, {"x": x}), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,groups", [(dict(), (1, 1)), (dict(pads=[1, 0, 1, 2], strides=[2, 1]), (1, 1)),
                                          (dict(dilations=[2, 1], group=2, offset_group=2), (2, 2)),
                                          (dict(offset_group=2, pads=[1, 1, 1, 1]), (1, 2))])
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv_matches_onnx_reference(attrs: dict[str, Any], groups: tuple[int, int],
                                            with_mask: bool) -> None:
    rng = np.random.default_rng(8)
    group, og = groups
    x = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = rng.standard_normal((6, 4 // group, 2, 3)).astype(np.float32)
    kh, kw = 2, 3
    pads = attrs.get("pads", [0, 0, 0, 0])
    st = attrs.get("strides", [1, 1])
    dl = attrs.get("dilations", [1, 1])
    oh = (6 + pads[0] + pads[2] - ((kh - 1) * dl[0] + 1)) // st[0] + 1
    ow = (5 + pads[1] + pads[3] - ((kw - 1) * dl[1] + 1)) // st[1] + 1
    off = (rng.standard_normal((2, 2 * og * kh * kw, oh, ow)) * 1.5).astype(np.float32)
    off[0, 0, 0, 0] = 0.25  # a tap that stays on the grid: exact corner weights
    feeds = {"x": x, "w": w, "off": off}
    names = ["x", "w", "off"]
    inputs = [("x", F32, x.shape), ("w", F32, w.shape), ("off", F32, off.shape)]
    if with_mask:
        feeds["b"] = rng.standard_normal((6,)).astype(np.float32)
        feeds["mask"] = rng.uniform(0, 1, (2, og * kh * kw, oh, ow)).astype(np.float32)
        names += ["b", "mask"]
        inputs += [("b", F32, (6,)), ("mask", F32, feeds["mask"].shape)]
    m = model(helper.make_node("DeformConv", names, ["y"], kernel_shape=[kh, kw], **attrs), inputs, F32)
    want = ref_run(m, feeds)[0]
    got = run_rlx(m, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,group", [(dict(), 1), (dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1]), 1),
                                         (dict(dilations=[2, 1, 1], output_padding=[1, 0, 1],
                                               strides=[2, 2, 2]), 2),
                                         (dict(auto_pad="SAME_UPPER", strides=[2, 2, 1]), 1),
                                         (dict(output_shape=[6, 5, 4], strides=[2, 2, 1]), 2)])
def test_conv_transpose_3d_matches_onnx_runtime(attrs: dict[str, Any], group: int) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4, 3, 3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 6 // group, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal((6,)).astype(np.float32)
    m = model(helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=group, **attrs),
              [("x", F32, x.shape), ("w", F32, w.shape), ("b", F32, b.shape)], F32)
    feeds = {"x": x, "w": w, "b": b}
    want = ort_run(m, feeds)
    got = run_rlx(m, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
