"""rlx-vulkan on Mesa lavapipe (software Vulkan): device probing, conformance, MiniLM parity,
profiling. A missing Vulkan loader/ICD or glslangValidator FAILS these tests (it does not skip)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from _devicetests import probe, small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError

APT = "apt-get install -y libvulkan1 mesa-vulkan-drivers glslang-tools (and pip install vulkan rlx-vulkan)"


@pytest.fixture(scope="module")
def device() -> object:
    return probe("rlx_vulkan", "no usable Vulkan device (Vulkan loader, Mesa lavapipe ICD, glslang)",
                 "pip install -e plugins/rlx-vulkan; " + APT)


def _mlp() -> tuple[object, dict[str, np.ndarray]]:
    return small_mlp("vk_mlp")


def test_device_is_lavapipe_or_real(device: object) -> None:
    assert device.name == "vulkan:0" and device.host_memory is False  # type: ignore[attr-defined]
    assert device.details["device"]  # type: ignore[attr-defined]


def test_probe_without_device_reports_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_vulkan import plugin, vk

    def boom() -> object:
        raise RuntimeError("VkErrorIncompatibleDriver: no ICD")

    monkeypatch.setattr(vk, "context", boom)
    dev = plugin.rlx_probe_devices()[0]
    assert dev.available is False and "no ICD" in dev.reason


def test_mlp_matches_cpu_and_profile_counts(device: object) -> None:
    graph, inputs = _mlp()
    exe = Session("vulkan").compile(graph)
    got = exe.run(**inputs)["probs"]
    want = Session("cpu").compile(graph).run(**inputs)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    text = exe.report.to_text()
    assert "vulkan.linear" in text and "vulkan.fused_elementwise" in text and "vulkan.softmax" in text
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    out, counts = compiled.profile({"x": inputs["x"]})
    assert counts["vulkan.matmul"] == 1 and counts["vulkan.linear"] == 1 and counts["vulkan.softmax"] == 1
    assert sum(counts.values()) == len(compiled.program.kernels)


def test_unsupported_dtype_fails_to_compile(device: object) -> None:
    g = GraphBuilder("f64")
    x = g.input("x", "f64", (4,))
    g.output(g.op("exp", x), "y")
    with pytest.raises(DispatchError):
        Session("vulkan").compile(g.build())


def test_conformance_suite_zero_failures(device: object) -> None:
    from rlx_conformance.reuse import certified_or_run

    t = time.perf_counter()
    cert = certified_or_run("vulkan")  # CI's certification of vulkan when it ran (RLX_CERT_DIR)
    counts = cert.counts()
    print(f"\nvulkan conformance: {counts} in {time.perf_counter() - t:.1f} s")
    bad = [f"{r.id}: {r.message[:300]}" for r in cert.results if r.status in ("failed", "error", "xpassed")]
    assert not bad, "\n".join(bad[:20])
    assert counts["passed"] >= 1950


def test_minilm_parity_with_cpu(device: object) -> None:
    from rlx_core.models.minilm import MiniLM, ModelNotFoundError

    try:
        m = MiniLM()
    except ModelNotFoundError as e:
        pytest.skip(f"MiniLM not installed: {e.what}")
    sents = ["The cat sits on the mat.", "Vulkan compute shaders on a software rasterizer.",
             "A quick brown fox jumps over the lazy dog near the river bank.", "hi"]
    want = m.embed(sents, device="cpu")
    t = time.perf_counter()
    got = m.embed(sents, device="vulkan")
    cos = (want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    print(f"\nMiniLM vulkan vs cpu cosine: {cos} ({time.perf_counter() - t:.1f} s incl. compile)")
    assert cos.min() >= 0.9999
