"""ONNX signal operators (``rlx_core.frontends.onnx_signal``, issue 17): DFT (opset 17 and 20 forms)
and STFT as products with a DFT matrix built at import, checked against NumPy's float64 FFT;
window functions and MelWeightMatrix with constant inputs fold at import, a run-time size is refused."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from _onnxtools import run_rlx as run_outputs  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx  # noqa: E402

F32, F64, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def model(node: Any, inputs: Sequence[tuple[str, int, Sequence[int]]],
          inits: dict[str, np.ndarray] | None = None, opset: int = 17) -> Any:
    graph = helper.make_graph([node], "case",
                              [helper.make_tensor_value_info(n, dt, list(s)) for n, dt, s in inputs],
                              [helper.make_tensor_value_info("y", inputs[0][1] if inputs else F32, None)],
                              initializer=[numpy_helper.from_array(np.asarray(a), n)
                                           for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 18 else 10
    return m


def run_rlx(m: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return run_outputs(m, feeds)[0]


def as_pairs(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1)


def _signal(shape: tuple[int, ...], complex_: bool, dt: Any) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(sum(shape))
    re = rng.standard_normal(shape)
    im = rng.standard_normal(shape) if complex_ else np.zeros(shape)
    x = np.stack([re, im], -1) if complex_ else re[..., None]
    return x.astype(dt), (re + 1j * im)


# name: (signal shape, complex, axis, inverse, onesided, dft_length)
CASES = {
    "real": ((2, 8), False, 1, 0, 0, None),
    "complex": ((2, 8), True, 1, 0, 0, None),
    "rfft_odd": ((3, 7), False, 1, 0, 1, None),
    "axis0": ((6, 4), True, 0, 0, 0, None),
    "middle_axis": ((2, 5, 3), True, 1, 0, 0, None),
    "pad": ((2, 6), False, 1, 0, 0, 10),
    "truncate": ((2, 9), True, 1, 0, 0, 5),
    "inverse": ((2, 8), True, 1, 1, 0, None),
    "inverse_len": ((2, 8), True, 1, 1, 0, 6),
}


def _numpy_dft(z: np.ndarray, axis: int, inverse: int, onesided: int, n: int | None) -> np.ndarray:
    n = z.shape[axis] if n is None else n
    y = np.fft.ifft(z, n=n, axis=axis) if inverse else np.fft.fft(z, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return as_pairs(y)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("dt,onnx_dt,tol", [(np.float32, F32, 2e-6), (np.float64, F64, 1e-13)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_dft_matches_numpy_fft(name: str, dt: Any, onnx_dt: int, tol: float, opset: int) -> None:
    shape, cplx, axis, inverse, onesided, n = CASES[name]
    x, z = _signal(shape, cplx, dt)
    inits: dict[str, np.ndarray] = {}
    ins = ["x", "n" if n is not None else ""]
    if n is not None:
        inits["n"] = np.array(n, np.int64)
    attrs: dict[str, Any] = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        ins.append("axis")
        inits["axis"] = np.array(axis, np.int64)
    else:
        attrs["axis"] = axis
    m = model(helper.make_node("DFT", ins, ["y"], **attrs), [("x", onnx_dt, x.shape)], inits, opset)
    got = run_rlx(m, {"x": x})
    want = _numpy_dft(z, axis, inverse, onesided, n)
    assert got.dtype == dt and got.shape == want.shape
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale * np.sqrt(shape[axis]))


@pytest.mark.parametrize("n,bins", [(8, 5), (7, 4), (8, 3), (6, 6)])
def test_dft_irfft(n: int, bins: int) -> None:
    """inverse + onesided: NumPy's irfft of the given bins (the DC and Nyquist imaginary parts ignored)."""
    rng = np.random.default_rng(n)
    spec = rng.standard_normal((2, bins)) + 1j * rng.standard_normal((2, bins))
    x = as_pairs(spec)
    m = model(helper.make_node("DFT", ["x", "n"], ["y"], axis=1, inverse=1, onesided=1),
              [("x", F64, x.shape)], {"n": np.array(n, np.int64)})
    got = run_rlx(m, {"x": x})
    np.testing.assert_allclose(got[..., 0], np.fft.irfft(spec, n=n, axis=1), rtol=0, atol=1e-13)
    np.testing.assert_allclose(got, ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=0, atol=1e-13)


def test_dft_bad_axis_and_run_time_length_are_refused() -> None:
    x = np.zeros((2, 8, 1), np.float32)
    m = model(helper.make_node("DFT", ["x"], ["y"], axis=2), [("x", F32, x.shape)])
    with pytest.raises(UnsupportedOnnxError, match="DFT axis 2"):
        load_onnx(m)
    m = model(helper.make_node("DFT", ["x", "n"], ["y"], axis=1), [("x", F32, x.shape), ("n", I64, ())])
    with pytest.raises(UnsupportedOnnxError, match="dft_length is computed at run time"):
        load_onnx(m)


@pytest.mark.parametrize("window,frame_length,onesided", [(True, None, 1), (False, 8, 1), (True, None, 0)])
def test_stft_matches_reference(window: bool, frame_length: int | None, onesided: int) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 40, 1)).astype(np.float32)
    inits: dict[str, np.ndarray] = {"step": np.array(5, np.int64)}
    ins = ["x", "step", "", ""]
    if window:
        inits["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype(np.float32)
        ins[2] = "w"
    if frame_length is not None:
        inits["fl"] = np.array(frame_length, np.int64)
        ins[3] = "fl"
    m = model(helper.make_node("STFT", ins, ["y"], onesided=onesided), [("x", F32, x.shape)], inits)
    got = run_rlx(m, {"x": x})
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert got.shape == want.shape == (2, 7, 5 if onesided else 8, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_windows_fold_with_a_constant_size_and_refuse_a_run_time_one(op: str) -> None:
    m = model(helper.make_node(op, ["n"], ["y"], periodic=0), [], {"n": np.array(10, np.int64)})
    np.testing.assert_array_equal(run_rlx(m, {}), ReferenceEvaluator(m).run(None, {})[0])
    m = model(helper.make_node(op, ["n"], ["y"]), [("n", I64, ())])
    with pytest.raises(UnsupportedOnnxError, match=f"{op} size is computed at run time"):
        load_onnx(m)
