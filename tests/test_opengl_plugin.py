"""rlx-opengl on Mesa's llvmpipe through headless EGL (or whatever EGL device is installed): device
probing, an MLP against the float64 reference, bool buffers, running from another thread than the
one that compiled (the GL context has one owner thread), the OpenGL flavour of the GLSL library.
A missing EGL/OpenGL driver FAILS these tests (it does not skip): CI installs Mesa's. Op-level
correctness is the conformance suite's (`rlx conformance opengl`, run by scripts/dev.sh)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from _devicetests import probe, small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

APT = ("apt-get install -y libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri (and pip install moderngl "
       "rlx-opengl)")


@pytest.fixture(scope="module")
def device() -> Any:
    return probe("rlx_opengl", "no usable OpenGL device (EGL and an OpenGL 4.3 driver)",
                 "pip install -e plugins/rlx-opengl; " + APT)


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    return small_mlp("gl_mlp")


def test_device_names_renderer(device: Any) -> None:
    assert device.name == "opengl:0" and device.host_memory is False
    assert device.details["renderer"] and device.details["version"]
    if "llvmpipe" in device.details["renderer"]:  # software: flagged, kept off auto-placement
        assert device.caps.unreliable


def test_mlp_matches_reference_natively(device: Any) -> None:
    graph, inputs = _mlp()
    exe = Session("opengl", use_cache=False).compile(graph)
    got = exe.run(inputs)["probs"]
    want = evaluate(graph, inputs)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert exe.report is not None
    entries = exe.report.entries
    assert "native" in {e.path for e in entries} and all(e.device == "opengl:0" for e in entries)
    text = exe.report.to_text()
    assert "opengl.linear" in text and "opengl.softmax" in text and "opengl.matmul" in text


def test_bool_buffers_and_where(device: Any) -> None:
    g = GraphBuilder("gl_bool")
    a = g.input("a", "f32", (5,))
    b = g.input("b", "f32", (5,))
    m = g.less(a, b)
    g.output(m, "mask")
    g.output(g.where(m, a, b), "low")
    av = np.array([1, 5, -2, 3, np.inf], np.float32)
    bv = np.array([2, 4, -2, 9, 0], np.float32)
    out = Session("opengl", use_cache=False).compile(g.build()).run({"a": av, "b": bv})
    np.testing.assert_array_equal(out["mask"], av < bv)
    np.testing.assert_array_equal(out["low"], np.minimum(av, bv))


def test_runs_from_another_thread(device: Any) -> None:
    """Every GL call goes to the context's own thread (an EGL context is current in one thread):
    compiling here and running in two other threads, one after the other, gives the same numbers."""
    graph, inputs = _mlp()
    exe = Session("opengl", use_cache=False).compile(graph)
    want = exe.run(inputs)["probs"]
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.append(exe.run(inputs)["probs"])) for _ in range(2)]
    for t in threads:
        t.start()
        t.join()
    assert len(got) == 2
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_opengl_flavour_of_the_glsl_library() -> None:
    """The same templates as rlx-vulkan, declared for OpenGL 4.3 (no descriptor sets, no push
    constants); the Vulkan flavour keeps its declarations."""
    from rlx_core.plugin import DType, glsl

    gl, vk = glsl.fill32(glsl.OPENGL), glsl.fill32(glsl.VULKAN)
    assert gl.startswith("#version 430\n") and vk.startswith("#version 450\n")
    assert "set = 0" not in gl and "push_constant" not in gl and "uniform RlxParams pc;" in gl
    assert "layout(std430, set = 0, binding = 0) buffer Arena" in vk and "push_constant" in vk
    assert gl.split("void main", 1)[1] == vk.split("void main", 1)[1]
    src = glsl.elementwise(glsl.OPENGL, glsl.single_op_program("sin", 1, {}), (DType.F32,), DType.F32)
    assert src.startswith("#version 430\n#extension GL_ARB_gpu_shader_int64 : require\n")


def test_missing_egl_device_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_opengl import plugin

    monkeypatch.setenv("RLX_OPENGL_EGL_DEVICE", "99")
    dev = plugin._probe()[0]
    assert not dev.available and "RLX_OPENGL_EGL_DEVICE" in dev.reason and "apt-get install" in dev.reason
